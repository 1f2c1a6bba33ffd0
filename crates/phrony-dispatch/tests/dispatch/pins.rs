//! Descriptor pins: registrations checked against the pins published agent versions hold,
//! refusals recorded before the worker is told, and calls routed only to workers advertising
//! their version's pin (or none).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use phrony_dispatch::{
    DescriptorPins, DescriptorRefusal, DispatchCall, DispatchError, DispatchFailure, HandlerAd,
    HookError, Router, RouterConfig, StatusClass, ToWorker,
};
use serde_json::json;

use crate::common::{FakeWorker, TOOL, VERSION, hello, invocation};

/// Pins per `tool@version`, refusals recorded in order; `fail` makes every lookup fail.
#[derive(Default)]
struct Pins {
    pins: HashMap<String, Vec<String>>,
    refused: Mutex<Vec<DescriptorRefusal>>,
    fail: bool,
}

#[async_trait]
impl DescriptorPins for Pins {
    async fn expected(&self, tool: &str, version: &str) -> Result<Vec<String>, HookError> {
        if self.fail {
            return Err("database is down".into());
        }
        Ok(self
            .pins
            .get(&format!("{tool}@{version}"))
            .cloned()
            .unwrap_or_default())
    }

    async fn refused(&self, refusal: &DescriptorRefusal) -> Result<(), HookError> {
        self.refused.lock().unwrap().push(refusal.clone());
        Ok(())
    }
}

fn pinned(pins: &[&str]) -> Pins {
    Pins {
        pins: HashMap::from([(
            format!("{TOOL}@{VERSION}"),
            pins.iter().map(|p| (*p).to_owned()).collect(),
        )]),
        ..Pins::default()
    }
}

fn router_with(pins: Arc<Pins>, strict: bool) -> Router {
    Router::builder(RouterConfig {
        require_descriptor_pins: strict,
        ..RouterConfig::default()
    })
    .descriptor_pins(pins)
    .build()
    .unwrap()
}

fn ad(tool: &str, hash: &str) -> HandlerAd {
    HandlerAd {
        tool: tool.into(),
        version: VERSION.into(),
        contract_version: "1".into(),
        max_concurrency: 4,
        descriptor_hash: hash.into(),
    }
}

/// The worker's next message is the acknowledgement of `call_id`.
async fn acked(worker: &mut FakeWorker, call_id: &str) {
    match worker.next().await {
        Some(ToWorker::ResultAck { call_id: acked }) => assert_eq!(acked, call_id),
        other => panic!("expected the ack of {call_id}, got {other:?}"),
    }
}

fn pinned_call(call_id: &str, pin: Option<&str>) -> DispatchCall {
    DispatchCall::new(
        invocation(call_id),
        "demo/refund-agent",
        Duration::from_secs(5),
        Some(Duration::from_secs(60)),
    )
    .with_descriptor_pin(pin.map(str::to_owned))
}

#[tokio::test(start_paused = true)]
async fn a_matching_or_empty_hash_registers_and_a_mismatch_is_refused_and_recorded() {
    let pins = Arc::new(pinned(&["sha256:v1", "sha256:v2"]));
    let router = router_with(Arc::clone(&pins), false);
    FakeWorker::connect(&router, hello("w-v2", vec![ad(TOOL, "sha256:v2")])).await;
    FakeWorker::connect(&router, hello("w-none", vec![ad(TOOL, "")])).await;
    // A tool no published version pins registers with any hash.
    FakeWorker::connect(
        &router,
        hello("w-other", vec![ad("orders.lookup", "sha256:x")]),
    )
    .await;
    assert!(pins.refused.lock().unwrap().is_empty());

    // One bad handler refuses the whole registration (the protocol cannot refuse one).
    let Err(err) = router
        .connect(hello(
            "w-bad",
            vec![ad("orders.lookup", ""), ad(TOOL, "sha256:forged")],
        ))
        .await
    else {
        panic!("a mismatching hash registered");
    };
    assert_eq!(err.status(), StatusClass::FailedPrecondition);
    let text = err.to_string();
    for part in [
        "w-bad",
        "payments.issue-refund@1.0.0",
        "\"sha256:forged\"",
        "sha256:v1, sha256:v2",
        "phrony tools pin",
    ] {
        assert!(text.contains(part), "{text} lacks {part}");
    }
    assert!(
        !router
            .snapshot()
            .workers
            .iter()
            .any(|w| w.worker_id == "w-bad"),
        "nothing of the refused registration is kept"
    );
    let refused = pins.refused.lock().unwrap().clone();
    assert_eq!(
        refused,
        [DescriptorRefusal {
            worker_id: "w-bad".into(),
            workload_identity: "playground/local".into(),
            image_digest: "sha256:dev".into(),
            credential: None,
            tool: TOOL.into(),
            version: VERSION.into(),
            received: "sha256:forged".into(),
            expected: vec!["sha256:v1".into(), "sha256:v2".into()],
        }]
    );

    // A verified registration names its credential in the record.
    assert!(
        router
            .connect_as(
                hello("w-bad2", vec![ad(TOOL, "sha256:nope")]),
                "\"bot\" (token)"
            )
            .await
            .is_err()
    );
    assert_eq!(
        pins.refused.lock().unwrap()[1].credential.as_deref(),
        Some("\"bot\" (token)")
    );
    // …and a refused registration does not bind the worker id.
    assert_eq!(router.worker_owner("w-bad2"), None);
}

#[tokio::test(start_paused = true)]
async fn strict_mode_refuses_an_empty_hash_even_for_a_tool_no_version_pins() {
    let pins = Arc::new(pinned(&["sha256:v1"]));
    let router = router_with(Arc::clone(&pins), true);
    FakeWorker::connect(&router, hello("w-ok", vec![ad(TOOL, "sha256:v1")])).await;
    FakeWorker::connect(
        &router,
        hello("w-new", vec![ad("orders.lookup", "sha256:x")]),
    )
    .await;
    for (worker, tool, expected) in [
        ("w-empty", TOOL, vec!["sha256:v1".to_owned()]),
        ("w-empty2", "orders.lookup", vec![]),
    ] {
        let err = router
            .connect(hello(worker, vec![ad(tool, "")]))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&err, DispatchError::DescriptorRefused { received, .. } if received.is_empty()),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("RUNTIME_REQUIRE_DESCRIPTOR_PINS"),
            "{err}"
        );
        let last = pins.refused.lock().unwrap().last().cloned().unwrap();
        assert_eq!((last.worker_id.as_str(), last.expected), (worker, expected));
    }
    // Without the hook, the strict rule still holds; the default accepts an empty hash.
    let bare = Router::new(RouterConfig {
        require_descriptor_pins: true,
        ..RouterConfig::default()
    })
    .unwrap();
    assert!(bare.connect(hello("w", vec![ad(TOOL, "")])).await.is_err());
    let lenient = Router::new(RouterConfig::default()).unwrap();
    assert!(
        lenient
            .connect(hello("w", vec![ad(TOOL, "")]))
            .await
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn a_registration_whose_pins_cannot_be_read_is_refused_as_unavailable() {
    let pins = Arc::new(Pins {
        fail: true,
        ..Pins::default()
    });
    let router = router_with(Arc::clone(&pins), false);
    let err = router
        .connect(hello("w", vec![ad(TOOL, "sha256:v1")]))
        .await
        .err()
        .unwrap();
    assert_eq!(err.status(), StatusClass::Unavailable);
    assert!(err.to_string().contains("database is down"), "{err}");
    assert!(router.snapshot().workers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn calls_go_only_to_workers_with_their_versions_pin_or_none() {
    let router = Router::new(RouterConfig::default()).unwrap();
    let mut v1 = FakeWorker::connect(&router, hello("w-v1", vec![ad(TOOL, "sha256:v1")])).await;
    let mut v2 = FakeWorker::connect(&router, hello("w-v2", vec![ad(TOOL, "sha256:v2")])).await;

    // Each version's calls reach the worker with its pin, whichever is less busy.
    for round in 0..3 {
        for (pin, worker) in [("sha256:v1", &mut v1), ("sha256:v2", &mut v2)] {
            let id = format!("{pin}-{round}");
            let router2 = router.clone();
            let c = pinned_call(&id, Some(pin));
            let task = tokio::spawn(async move { router2.dispatch(c).await });
            let got = worker.expect_invoke().await;
            assert_eq!(got.call_id, id);
            worker.succeed(&id, json!({"by": pin})).unwrap();
            let done = task.await.unwrap().unwrap();
            assert_eq!(done.worker.descriptor_hash, pin);
            done.ack.ack();
            acked(worker, &id).await;
        }
    }
    v1.expect_nothing().await;
    v2.expect_nothing().await;

    // An unpinned call may go to either.
    let router2 = router.clone();
    let task = tokio::spawn(async move { router2.dispatch(pinned_call("free", None)).await });
    let (worker, id) = match (v1.next().await, v2.next().await) {
        (Some(ToWorker::Invoke(i)), None) => (&mut v1, i.call_id),
        (None, Some(ToWorker::Invoke(i))) => (&mut v2, i.call_id),
        other => panic!("expected one invoke, got {other:?}"),
    };
    worker.succeed(&id, json!({})).unwrap();
    task.await.unwrap().unwrap().ack.ack();
    acked(worker, &id).await;

    // A pin no worker advertises waits in the queue, then fails naming both sides.
    let router2 = router.clone();
    let task = tokio::spawn(async move {
        router2
            .dispatch(pinned_call("lost", Some("sha256:v3")))
            .await
    });
    v1.expect_nothing().await;
    v2.expect_nothing().await;
    tokio::time::advance(Duration::from_secs(6)).await;
    let failure = task.await.unwrap().err().unwrap();
    assert!(
        matches!(&failure, DispatchFailure::DescriptorMismatch { pin, .. } if pin == "sha256:v3"),
        "{failure:?}"
    );
    assert_eq!(failure.code(), "descriptor_mismatch");
    assert!(!failure.outcome_unknown());

    // A queued pinned call is served when a matching worker registers, not by the others.
    let router2 = router.clone();
    let task = tokio::spawn(async move {
        router2
            .dispatch(pinned_call("late", Some("sha256:v3")))
            .await
    });
    v1.expect_nothing().await;
    let mut v3 = FakeWorker::connect(&router, hello("w-v3", vec![ad(TOOL, "sha256:v3")])).await;
    assert_eq!(v3.expect_invoke().await.call_id, "late");
    v3.succeed("late", json!({})).unwrap();
    task.await.unwrap().unwrap().ack.ack();
    acked(&mut v3, "late").await;

    // An unpinned worker (empty hash, the published SDK's default) serves a pinned call.
    drop(v1);
    drop(v2);
    drop(v3);
    let mut plain = FakeWorker::connect(&router, hello("w-plain", vec![ad(TOOL, "")])).await;
    let router2 = router.clone();
    let task = tokio::spawn(async move {
        router2
            .dispatch(pinned_call("any", Some("sha256:v1")))
            .await
    });
    assert_eq!(plain.expect_invoke().await.call_id, "any");
    plain.succeed("any", json!({})).unwrap();
    let done = task.await.unwrap().unwrap();
    assert_eq!(done.worker.descriptor_hash, "");
}
