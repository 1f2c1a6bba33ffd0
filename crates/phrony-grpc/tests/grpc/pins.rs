//! Tool descriptor pinning over real Work streams, on SQLite and PostgreSQL: a worker whose
//! `descriptor_hash` matches a published version's pin registers and gets its calls, a
//! mismatch is refused (`FAILED_PRECONDITION`) and recorded as `worker.descriptor_refused`, an
//! empty hash keeps working (recorded unpinned on `tool.dispatched`) unless the daemon requires
//! pins, and two agent versions that pin different descriptors of one `tool@version` each get
//! the workers serving theirs. A flood of refused registrations writes a bounded number of
//! events (`phrony_engine::refusals`), each registration still refused.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pb::work_client_msg::Body as Up;
use pb::work_server_msg::Body as Down;
use phrony_ledger::{EventBody, Ledger, WORKERS_STREAM, WorkerDescriptorRefused};
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_runtime::SecretsKey;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};

use crate::sessions::{Db, Server, publish_and_deploy, run, wait_status};

const REFUND: &str = "payments.issue-refund";
const LOOKUP: &str = "orders.lookup-order";
const PATIENCE: Duration = Duration::from_secs(20);

/// The refund example as agent `support/<name>`, the refund tool's description replaced.
fn agent(name: &str, description: &str) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/refund-agent");
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            let text = std::fs::read_to_string(entry.path()).unwrap().replace(
                "description: Issue a refund to the customer's original payment method.",
                &format!("description: {description}"),
            );
            std::fs::write(dir.path().join(sub).join(entry.file_name()), text).unwrap();
        }
    }
    let text = std::fs::read_to_string(src.join("agent.yaml"))
        .unwrap()
        .replace("name: refund-agent", &format!("name: {name}"));
    std::fs::write(dir.path().join("agent.yaml"), text).unwrap();
    let agent = match phrony_manifest::load_agent(dir.path().join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the refund example does not compile:\n{d}"),
    };
    // The pin of the refund tool is what a worker passes; `phrony tools pin` prints it for
    // the Tool document.
    let file =
        phrony_manifest::tool_descriptor_pin(dir.path().join("tools/payments.issue-refund.yaml"))
            .unwrap();
    assert_eq!(pin_of(&agent, REFUND), file.pin);
    agent
}

fn pin_of(agent: &CompiledAgent, tool: &str) -> String {
    agent
        .tool_pins()
        .into_iter()
        .find(|p| p.tool == tool)
        .unwrap()
        .pin
}

/// A worker serving both tools of the refund agent, with the given hashes; it answers every
/// invoke with a refund and records the invokes.
struct Worker {
    invokes: Arc<Mutex<Vec<pb::WorkInvoke>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Worker {
    async fn connect(
        server: &Server,
        worker_id: &str,
        refund_hash: &str,
        lookup_hash: &str,
    ) -> Result<Self, Status> {
        let handler = |tool: &str, hash: &str| pb::WorkHandlerAdvertisement {
            tool: tool.into(),
            version: "1.0.0".into(),
            contract_version: String::new(),
            max_concurrency: 4,
            descriptor_hash: hash.into(),
        };
        let (up, rx) = mpsc::channel(16);
        let msg = |body| pb::WorkClientMsg { body: Some(body) };
        up.send(msg(Up::Register(pb::WorkRegister {
            worker_id: worker_id.into(),
            workload_identity: "tests/pins".into(),
            image_digest: "sha256:img".into(),
            handlers: vec![handler(LOOKUP, lookup_hash), handler(REFUND, refund_hash)],
            in_flight: Vec::new(),
        })))
        .await
        .unwrap();
        let mut down = server
            .client()
            .await
            .work(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = tokio::time::timeout(PATIENCE, down.message())
            .await
            .unwrap()?
            .and_then(|m| m.body);
        assert!(
            matches!(first, Some(Down::Registered(_))),
            "expected registered, got {first:?}"
        );
        let invokes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&invokes);
        let task = tokio::spawn(async move {
            while let Ok(Some(m)) = down.message().await {
                if let Some(Down::Invoke(inv)) = m.body {
                    seen.lock().unwrap().push(inv.clone());
                    let args: Value = serde_json::from_slice(&inv.args).unwrap();
                    let payload = json!({"refund_id": "rf_1", "amount": args["amount"]});
                    let _ = up
                        .send(msg(Up::Result(pb::WorkToolResult {
                            call_id: inv.call_id,
                            payload: payload.to_string().into_bytes(),
                            error: None,
                        })))
                        .await;
                }
            }
        });
        Ok(Self { invokes, task })
    }

    fn refunds(&self) -> usize {
        self.invokes
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.tool == REFUND)
            .count()
    }
}

/// The `worker.descriptor_refused` events recorded so far.
async fn refusals(db: &Db) -> Vec<WorkerDescriptorRefused> {
    let ledger = Ledger::connect(&db.url).await.unwrap();
    let events = match ledger.list_events(WORKERS_STREAM, 0, 100).await {
        Ok(events) => events,
        Err(e) if e.to_string().contains("not found") => Vec::new(),
        Err(e) => panic!("{e}"),
    };
    ledger.close().await;
    events
        .iter()
        .map(|e| match e.body().unwrap() {
            EventBody::WorkerDescriptorRefused(r) => {
                assert_eq!(e.actor, "worker");
                r
            }
            other => panic!("unexpected event in the workers stream: {other:?}"),
        })
        .collect()
}

/// The `descriptor_hash` recorded on the session's `tool.dispatched` event.
async fn dispatched_hash(db: &Db, session_id: &str) -> Option<String> {
    let ledger = Ledger::connect(&db.url).await.unwrap();
    let events = ledger.list_events(session_id, 0, 1000).await.unwrap();
    ledger.close().await;
    events
        .iter()
        .find_map(|e| match e.body().unwrap() {
            EventBody::ToolDispatched(d) => Some(d.descriptor_hash),
            _ => None,
        })
        .expect("no tool.dispatched event")
}

async fn refund(server: &Server, agent: &str) -> String {
    let mut client = server.client().await;
    let id = run(&mut client, agent, "Refund 100 for ORD-1").await;
    wait_status(&mut client, &id, "completed").await;
    id
}

async fn pinned_workers_and_audited_refusals(db: Db) {
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let mut client = server.client().await;
    let a = agent("refund-a", "Refund the order (contract A).");
    let b = agent("refund-b", "Refund the order (contract B).");
    let (pin_a, pin_b) = (pin_of(&a, REFUND), pin_of(&b, REFUND));
    assert_ne!(pin_a, pin_b);
    publish_and_deploy(&mut client, &a).await;
    publish_and_deploy(&mut client, &b).await;

    // 1. A hash that matches no published pin is refused, naming what was expected, and
    //    recorded before the worker hears it.
    let refused = Worker::connect(&server, "w-forged", "sha256:forged", "")
        .await
        .err()
        .expect("a forged descriptor hash registered");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let mut expected = vec![pin_a.clone(), pin_b.clone()];
    expected.sort();
    for part in [
        "w-forged".to_owned(),
        format!("{REFUND}@1.0.0"),
        "\"sha256:forged\"".to_owned(),
        expected.join(", "),
    ] {
        assert!(
            refused.message().contains(&part),
            "{} lacks {part}",
            refused.message()
        );
    }
    assert_eq!(
        refusals(&db).await,
        [WorkerDescriptorRefused {
            worker_id: "w-forged".into(),
            workload_identity: "tests/pins".into(),
            image_digest: "sha256:img".into(),
            verified_credential: None,
            tool: REFUND.into(),
            version: "1.0.0".into(),
            received_hash: "sha256:forged".into(),
            expected_pins: expected,
            repeated: 0,
            unrecorded_refusals: 0,
        }]
    );

    // 2. Workers with either version's pin register; each version's calls reach only its own.
    let wa = Worker::connect(&server, "w-a", &pin_a, "").await.unwrap();
    let wb = Worker::connect(&server, "w-b", &pin_b, "").await.unwrap();
    // An order the least-busy, least-recently-used choice alone would spread over both.
    let (mut to_a, mut to_b) = (0, 0);
    for agent in [
        "refund-a", "refund-a", "refund-b", "refund-a", "refund-b", "refund-b",
    ] {
        let id = refund(&server, agent).await;
        let pin = if agent == "refund-a" {
            to_a += 1;
            &pin_a
        } else {
            to_b += 1;
            &pin_b
        };
        assert_eq!((wa.refunds(), wb.refunds()), (to_a, to_b), "after {agent}");
        assert_eq!(
            dispatched_hash(&db, &id).await.as_deref(),
            Some(pin.as_str())
        );
    }
    drop(wa);
    drop(wb);

    // 3. An empty hash (the published SDK's default) registers and serves either version,
    //    recorded unpinned; nothing more was refused.
    let plain = Worker::connect(&server, "w-plain", "", "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let id = refund(&server, "refund-a").await;
    assert_eq!(plain.refunds(), 1);
    assert_eq!(dispatched_hash(&db, &id).await, None);
    assert_eq!(refusals(&db).await.len(), 1);
    drop(plain);
    server.stop().await;
}

#[tokio::test]
async fn pinned_workers_and_audited_refusals_on_sqlite() {
    pinned_workers_and_audited_refusals(Db::sqlite()).await;
}

#[tokio::test]
async fn pinned_workers_and_audited_refusals_on_postgres() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    pinned_workers_and_audited_refusals(db).await;
}

#[tokio::test]
async fn required_pins_refuse_an_empty_hash_and_a_pinned_worker_serves() {
    let db = Db::sqlite();
    let server = Server::start_with(&db, &SecretsKey::generate().unwrap(), Arc::default(), |c| {
        c.router_config.require_descriptor_pins = true;
    })
    .await;
    let mut client = server.client().await;
    let a = agent("refund-a", "Refund the order.");
    publish_and_deploy(&mut client, &a).await;
    let refused = Worker::connect(&server, "w-plain", "", "")
        .await
        .err()
        .expect("an empty hash registered in strict mode");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("RUNTIME_REQUIRE_DESCRIPTOR_PINS"),
        "{}",
        refused.message()
    );
    let recorded = refusals(&db).await;
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        (
            recorded[0].tool.as_str(),
            recorded[0].received_hash.as_str()
        ),
        (LOOKUP, "")
    );
    assert_eq!(recorded[0].expected_pins, [pin_of(&a, LOOKUP)]);

    let pinned = Worker::connect(
        &server,
        "w-pinned",
        &pin_of(&a, REFUND),
        &pin_of(&a, LOOKUP),
    )
    .await
    .unwrap();
    refund(&server, "refund-a").await;
    assert_eq!(pinned.refunds(), 1);
    drop(pinned);
    server.stop().await;
}

/// A process that keeps registering with forged hashes is refused every time, but writes at
/// most one event per registration a minute and at most the budget over all of them.
#[tokio::test]
async fn a_flood_of_refused_registrations_writes_a_bounded_number_of_events() {
    use phrony_engine::refusals::EVENTS_PER_WINDOW;
    let db = Db::sqlite();
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let mut client = server.client().await;
    publish_and_deploy(&mut client, &agent("refund-a", "Refund the order.")).await;

    let refuse = |worker: String, hash: String| {
        let server = &server;
        async move {
            let refused = Worker::connect(server, &worker, &hash, "")
                .await
                .err()
                .unwrap_or_else(|| panic!("{worker} registered with {hash}"));
            assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        }
    };
    // The same forged registration from five processes (five worker ids): one event.
    for i in 0..5 {
        refuse(format!("w-same-{i}"), "sha256:forged".into()).await;
    }
    let recorded = refusals(&db).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].worker_id, "w-same-0");

    // A new hash each time: events up to the budget, every registration still refused.
    let budget = usize::try_from(EVENTS_PER_WINDOW).unwrap();
    for i in 0..budget + 5 {
        refuse(format!("w-flood-{i}"), format!("sha256:flood-{i}")).await;
    }
    let recorded = refusals(&db).await;
    assert_eq!(recorded.len(), budget, "{recorded:?}");
    assert!(
        recorded
            .iter()
            .all(|r| r.repeated == 0 && r.unrecorded_refusals == 0),
        "no count is carried before the windows end: {recorded:?}"
    );
    server.stop().await;
}
