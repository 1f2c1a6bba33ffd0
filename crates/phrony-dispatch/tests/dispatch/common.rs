//! Shared helpers: an in-process fake worker and a recording observer.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use phrony_dispatch::{
    DispatchCall, DispatchError, FromWorker, HandlerAd, Invocation, Outbox, Router, RouterConfig,
    RouterEvent, RouterObserver, ToWorker, WorkerConnection, WorkerHello,
};
use serde_json::json;

pub(crate) const TOOL: &str = "payments.issue-refund";
pub(crate) const VERSION: &str = "1.0.0";

pub(crate) fn handler(tool: &str, version: &str, max_concurrency: u32) -> HandlerAd {
    HandlerAd {
        tool: tool.into(),
        version: version.into(),
        contract_version: "1".into(),
        max_concurrency,
        descriptor_hash: format!("sha256:{tool}"),
    }
}

pub(crate) fn hello(worker_id: &str, handlers: Vec<HandlerAd>) -> WorkerHello {
    WorkerHello {
        worker_id: worker_id.into(),
        workload_identity: "playground/local".into(),
        image_digest: "sha256:dev".into(),
        handlers,
        in_flight: Vec::new(),
    }
}

pub(crate) fn invocation(call_id: &str) -> Invocation {
    invocation_for(call_id, TOOL, VERSION)
}

pub(crate) fn invocation_for(call_id: &str, tool: &str, version: &str) -> Invocation {
    Invocation {
        call_id: call_id.into(),
        session_id: "run_1".into(),
        agent_version_id: "av_1".into(),
        turn: 1,
        tool: tool.into(),
        version: version.into(),
        args: json!({"order_id": call_id}),
        side_effect_class: "non_idempotent_write".into(),
        deadline_unix_ms: 0,
        trace_context: std::collections::BTreeMap::new(),
    }
}

/// A call waiting up to 60s for a slot and 60s for the answer.
pub(crate) fn call(call_id: &str) -> DispatchCall {
    DispatchCall::new(
        invocation(call_id),
        "demo/refund-agent",
        Duration::from_secs(60),
        Some(Duration::from_secs(60)),
    )
}

pub(crate) fn router() -> Router {
    Router::new(RouterConfig::default()).unwrap()
}

/// Records every event; acknowledges nothing on its own.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) events: Mutex<Vec<RouterEvent>>,
}

impl RouterObserver for Recorder {
    fn on_event(&self, event: RouterEvent) {
        self.events.lock().unwrap().push(event);
    }
}

impl Recorder {
    pub(crate) fn take(&self) -> Vec<RouterEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

pub(crate) fn recording_router(config: RouterConfig) -> (Router, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let router = Router::builder(config)
        .observer(recorder.clone())
        .build()
        .unwrap();
    (router, recorder)
}

/// Lets spawned tasks run without advancing time.
pub(crate) async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// An in-process worker: the two halves of its stream.
pub(crate) struct FakeWorker {
    pub(crate) conn: WorkerConnection,
    pub(crate) outbox: Outbox,
}

impl FakeWorker {
    pub(crate) async fn connect(router: &Router, hello: WorkerHello) -> Self {
        let (conn, mut outbox) = router.connect(hello).await.unwrap();
        match outbox.try_recv() {
            Some(ToWorker::Registered { .. }) => {}
            other => panic!("expected Registered first, got {other:?}"),
        }
        Self { conn, outbox }
    }

    pub(crate) async fn simple(router: &Router, worker_id: &str, max_concurrency: u32) -> Self {
        Self::connect(
            router,
            hello(worker_id, vec![handler(TOOL, VERSION, max_concurrency)]),
        )
        .await
    }

    /// The next queued message, after letting other tasks run.
    pub(crate) async fn next(&mut self) -> Option<ToWorker> {
        settle().await;
        self.outbox.try_recv()
    }

    pub(crate) async fn expect_invoke(&mut self) -> Invocation {
        match self.next().await {
            Some(ToWorker::Invoke(invocation)) => *invocation,
            other => panic!("expected an invoke, got {other:?}"),
        }
    }

    /// All invokes currently queued for this worker.
    pub(crate) async fn invokes(&mut self) -> Vec<Invocation> {
        settle().await;
        let mut out = Vec::new();
        while let Some(msg) = self.outbox.try_recv() {
            match msg {
                ToWorker::Invoke(invocation) => out.push(*invocation),
                other => panic!("expected only invokes, got {other:?}"),
            }
        }
        out
    }

    pub(crate) async fn expect_nothing(&mut self) {
        settle().await;
        if let Some(msg) = self.outbox.try_recv() {
            panic!("expected no message, got {msg:?}");
        }
    }

    pub(crate) fn succeed(
        &self,
        call_id: &str,
        payload: serde_json::Value,
    ) -> Result<(), DispatchError> {
        self.conn.handle(FromWorker::Result {
            call_id: call_id.into(),
            payload: serde_json::to_vec(&payload).unwrap(),
            error: None,
        })
    }

    pub(crate) fn nack(&self, call_id: &str) -> Result<(), DispatchError> {
        self.conn.handle(FromWorker::Nack {
            call_id: call_id.into(),
            code: "unknown_handler".into(),
            message: format!("no handler registered for {TOOL}@{VERSION}"),
        })
    }

    pub(crate) fn heartbeat(&self) -> Result<(), DispatchError> {
        self.conn.handle(FromWorker::Heartbeat)
    }
}
