//! History-aware policy conditions end to end: the real daemon runs the example agents of
//! `policies-examples/refund-cumulative/` and `policies-examples/payout-verification/` (on the
//! scripted `stub` model, with their own tools and policies), a worker serves their tools, and
//! the decisions follow from the calls recorded earlier in the ledger:
//! - refunds of an order are capped by the order total `lookup_order` returned, cumulatively; a
//!   refund the bank declined is released, so the same amount fits again;
//! - the 4th refund of a customer within 24 hours is denied;
//! - a payout without an earlier `verify_payee` of the same payee is denied, with one allowed.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use phrony_sdk::{Call, ToolError, Worker};
use serde_json::{Value, json};
use tests::cli::{json, ok, phrony};
use tests::daemon::{Backend, Daemon};
use tests::stub::{publish_and_deploy, stub_daemon, write_stub_script};

/// A worker serving the example tools; records `(tool, args)` of every invocation.
struct Tools {
    invoked: Arc<Mutex<Vec<(String, Value)>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Tools {
    fn start(addr: &str, worker_id: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let invoked = Arc::new(Mutex::new(Vec::new()));
        let record = |tool: &'static str| {
            let invoked = Arc::clone(&invoked);
            move |args: &Value| {
                invoked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((tool.to_owned(), args.clone()));
            }
        };
        let (lookup, refund, verify, payout) = (
            record("lookup_order"),
            record("refund_order"),
            record("verify_payee"),
            record("send_payout"),
        );
        let worker = Worker::builder()
            .runtime_addr(addr)
            .worker_id(worker_id)
            .workload_identity(format!("tests/{worker_id}"))
            .concurrency(4)
            .tool(
                "orders.lookup-order",
                "1.0.0",
                move |args: Value, _: Call| {
                    lookup(&args);
                    async move {
                        Ok::<_, ToolError>(json!({"order_id": args["order_id"], "total": 100}))
                    }
                },
            )
            .tool(
                "payments.refund-order",
                "1.0.0",
                move |args: Value, _: Call| {
                    refund(&args);
                    async move {
                        if args["note"] == "decline" {
                            return Err(ToolError::new("card_declined", "the bank declined it"));
                        }
                        Ok(json!({"refund_id": "rf_1", "amount": args["amount"]}))
                    }
                },
            )
            .tool(
                "payees.verify-payee",
                "1.0.0",
                move |args: Value, _: Call| {
                    verify(&args);
                    async move { Ok::<_, ToolError>(json!({"verified": true})) }
                },
            )
            .tool(
                "payouts.send-payout",
                "1.0.0",
                move |args: Value, _: Call| {
                    payout(&args);
                    async move { Ok::<_, ToolError>(json!({"payout_id": "po_1"})) }
                },
            )
            .build()
            .unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let mut running = worker.start();
            let registered = running.registered().await.map_err(|e| e.to_string());
            let _ = ready_tx.send(registered);
            std::future::pending::<()>().await;
            drop(running);
        });
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap()
            .unwrap();
        Self {
            invoked,
            _runtime: runtime,
        }
    }

    fn invocations(&self) -> Vec<(String, Value)> {
        self.invoked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Copies an example project into `dir`, on the stub model, with this script.
fn write_example(example: &str, dir: &Path, turns: &Value) {
    let from = tests::examples_dir().join(example);
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for entry in std::fs::read_dir(from.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join(sub).join(path.file_name().unwrap())).unwrap();
        }
    }
    let agent = std::fs::read_to_string(from.join("agent.yaml"))
        .unwrap()
        .replace(
            "provider: openai\n    name: gpt-4o",
            "provider: stub\n    name: scripted",
        );
    assert!(agent.contains("provider: stub"), "{agent}");
    std::fs::write(dir.join("agent.yaml"), agent).unwrap();
    write_stub_script(dir, turns);
}

/// One completion per call, in order, then a closing text.
fn script(calls: &[(&str, Value)]) -> Value {
    let mut turns: Vec<Value> = calls
        .iter()
        .map(|(name, args)| {
            json!([
                {"type": "tool_call", "name": name, "args": args},
                {"type": "completed", "stop_reason": "tool_use"}
            ])
        })
        .collect();
    turns.push(json!([
        {"type": "text_delta", "text": "Done."},
        {"type": "completed", "stop_reason": "end_turn"}
    ]));
    Value::Array(turns)
}

/// Runs `agent` and waits for its session to complete; returns the inspected session as text.
fn run(daemon: &Daemon, agent: &str) -> String {
    let started = ok(phrony(daemon, "emad").args(["run", agent, "--input", "go"]));
    let id = started
        .strip_prefix("session ")
        .and_then(|rest| rest.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let inspected = ok(phrony(daemon, "ci").args([
            "sessions",
            "inspect",
            &id,
            "--payloads",
            "--output",
            "json",
        ]));
        let status = json(&inspected)["session"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status == "completed" {
            return inspected;
        }
        assert!(
            !["failed", "cancelled"].contains(&status.as_str()) && Instant::now() < deadline,
            "session {id} is {status}\n{inspected}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn refunds(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let tools = Tools::start(daemon.addr(), "history-tools");
    let project = tempfile::tempdir().unwrap();
    let refund = |order: &str, amount: f64| json!({"order_id": order, "customer_id": "C-7", "amount": amount, "currency": "EUR"});
    let mut declined = refund("ORD-1", 60.0);
    declined["note"] = json!("decline");
    write_example(
        "refund-cumulative",
        project.path(),
        &script(&[
            // No lookup yet: the order total is unknown, the refund is denied (fail-closed).
            ("refund_order", refund("ORD-1", 10.0)),
            ("lookup_order", json!({"order_id": "ORD-1"})),
            ("refund_order", refund("ORD-1", 40.0)),
            // Allowed (40 + 60 fits 100), then declined by the bank: released.
            ("refund_order", declined),
            // Fits only because the declined one was released.
            ("refund_order", refund("ORD-1", 60.0)),
            // 40 + 60 + 1 > 100.
            ("refund_order", refund("ORD-1", 1.0)),
            ("lookup_order", json!({"order_id": "ORD-2"})),
            // The customer's 3rd refund in 24 h (the declined one does not count).
            ("refund_order", refund("ORD-2", 10.0)),
            // The 4th: denied.
            ("refund_order", refund("ORD-2", 10.0)),
        ]),
    );
    publish_and_deploy(&daemon, project.path(), "support/refund-cumulative-agent");
    let inspected = run(&daemon, "support/refund-cumulative-agent");

    let reached: Vec<(String, Value)> = tools.invocations();
    let amounts: Vec<(String, Value)> = reached
        .iter()
        .map(|(tool, args)| {
            (
                tool.clone(),
                if tool == "refund_order" {
                    args["amount"].clone()
                } else {
                    args["order_id"].clone()
                },
            )
        })
        .collect();
    assert_eq!(
        amounts,
        [
            ("lookup_order".to_owned(), json!("ORD-1")),
            ("refund_order".to_owned(), json!(40.0)),
            ("refund_order".to_owned(), json!(60.0)),
            ("refund_order".to_owned(), json!(60.0)),
            ("lookup_order".to_owned(), json!("ORD-2")),
            ("refund_order".to_owned(), json!(10.0)),
        ],
        "{inspected}\n{}",
        daemon.logs()
    );
    assert_eq!(
        inspected
            .matches("policy denied payments.refund-order: The refunds of this order would exceed")
            .count(),
        2,
        "the unlooked-up and the over-total refunds: {inspected}"
    );
    assert_eq!(
        inspected
            .matches("policy denied payments.refund-order: This customer already had 3 refunds")
            .count(),
        1,
        "{inspected}"
    );

    // A second session of the same customer: the daily cap holds across sessions.
    let project2 = tempfile::tempdir().unwrap();
    write_example(
        "refund-cumulative",
        project2.path(),
        &script(&[
            ("lookup_order", json!({"order_id": "ORD-3"})),
            ("refund_order", refund("ORD-3", 5.0)),
        ]),
    );
    let agent = std::fs::read_to_string(project2.path().join("agent.yaml"))
        .unwrap()
        .replace("version: 0.1.0", "version: 0.2.0");
    std::fs::write(project2.path().join("agent.yaml"), agent).unwrap();
    ok(phrony(&daemon, "ci")
        .args(["agents", "publish"])
        .arg(project2.path().join("agent.yaml")));
    ok(phrony(&daemon, "ci").args(["agents", "deploy", "support/refund-cumulative-agent@0.2.0"]));
    let inspected = run(&daemon, "support/refund-cumulative-agent");
    assert_eq!(
        tools.invocations().len(),
        reached.len() + 1,
        "only the lookup ran: {inspected}"
    );
    assert_eq!(
        inspected
            .matches("policy denied payments.refund-order: This customer already had 3 refunds")
            .count(),
        1,
        "{inspected}"
    );
}

fn payouts(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let tools = Tools::start(daemon.addr(), "payout-tools");
    let project = tempfile::tempdir().unwrap();
    let payout = json!({"payee_iban": "DE89370400440532013000", "amount": 500, "currency": "EUR"});
    write_example(
        "payout-verification",
        project.path(),
        &script(&[
            ("send_payout", payout.clone()),
            (
                "verify_payee",
                json!({"payee_iban": "FR7630006000011234567890189"}),
            ),
            ("send_payout", payout.clone()),
            (
                "verify_payee",
                json!({"payee_iban": "DE89370400440532013000"}),
            ),
            ("send_payout", payout.clone()),
        ]),
    );
    publish_and_deploy(&daemon, project.path(), "finance/payout-agent");
    let inspected = run(&daemon, "finance/payout-agent");
    let reached: Vec<String> = tools.invocations().into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        reached,
        ["verify_payee", "verify_payee", "send_payout"],
        "{inspected}\n{}",
        daemon.logs()
    );
    assert_eq!(
        inspected
            .matches("policy denied payouts.send-payout: Verify the payee with verify_payee")
            .count(),
        2,
        "{inspected}"
    );
}

#[test]
fn history_caps_refunds_on_sqlite() {
    refunds(Backend::Sqlite);
}

#[test]
fn history_caps_refunds_on_postgres() {
    refunds(Backend::Postgres);
}

#[test]
fn history_requires_verification_on_sqlite() {
    payouts(Backend::Sqlite);
}
