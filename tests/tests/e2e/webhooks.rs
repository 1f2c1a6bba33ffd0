//! Webhook deliveries through the CLI on the real daemon and `phrony`, on SQLite and
//! PostgreSQL: the €400 refund's `approval.required` goes to a receiver nobody listens on, fails
//! after its one attempt and is listed by `phrony webhooks deliveries --failed` (table and JSON);
//! `phrony webhooks retry` re-queues it under the same id, recorded as `webhook.retry_requested`
//! by whoever asked. A delivery still pending when its webhook is removed from the file is failed
//! at the next start ("webhook `pager` is no longer configured", audited as
//! `webhook.unconfigured`), and an operator retry of it is refused.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{fails, json, ok, phrony, table};
use tests::daemon::{Backend, Daemon, free_port};
use tests::stub::{REFUND_AGENT, publish_and_deploy, write_refund_agent};

/// The failed deliveries, polled until there are `n` with at least `attempts` attempts.
fn wait_failed(daemon: &Daemon, n: usize, attempts: u64) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = json(&ok(phrony(daemon, "ci").args([
            "webhooks",
            "deliveries",
            "--failed",
            "--json",
        ])));
        let failed = listed["deliveries"].as_array().cloned().unwrap_or_default();
        if failed.len() == n
            && failed
                .iter()
                .all(|d| d["attempts"].as_u64() >= Some(attempts))
        {
            return failed;
        }
        assert!(
            Instant::now() < deadline,
            "no {n} failed deliveries: {listed}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The deliveries as `phrony webhooks deliveries --json` lists them.
fn deliveries(daemon: &Daemon, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["webhooks", "deliveries", "--json"];
    all.extend_from_slice(args);
    json(&ok(phrony(daemon, "ci").args(all)))["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn deliveries_fail_then_are_retried(backend: Backend) {
    let hooks = tempfile::tempdir().unwrap();
    let file = hooks.path().join("hooks.yaml");
    std::fs::write(
        &file,
        format!(
            "webhooks:\n  - name: pager\n    url: http://127.0.0.1:{}/hook\n    events: \
             [approval.required]\n    secret_env: HOOK_SECRET\n    timeout: 1s\n    \
             max_attempts: 1\n",
            free_port()
        ),
    )
    .unwrap();
    let Some(daemon) = Daemon::start_with_env(
        backend,
        &[
            ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
            ("RUNTIME_WEBHOOKS_FILE", file.to_str().unwrap()),
            ("HOOK_SECRET", "0123456789abcdef-secret"),
        ],
    ) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    write_refund_agent(
        project.path(),
        &json!([[
            {"type": "tool_call", "name": "issue_refund",
             "args": {"order_id": "ORD-7", "amount": 400, "currency": "EUR",
                      "reason": "The item arrived damaged."}},
            {"type": "completed", "stop_reason": "tool_use"}
        ]]),
    );
    publish_and_deploy(&daemon, project.path(), REFUND_AGENT);
    assert_eq!(
        ok(phrony(&daemon, "ci").args(["webhooks", "deliveries"])),
        "no deliveries\n"
    );
    ok(phrony(&daemon, "emad").args(["run", REFUND_AGENT, "--input", "Refund €400 for ORD-7."]));

    let failed = wait_failed(&daemon, 1, 1);
    let delivery = &failed[0];
    assert_eq!(delivery["webhook"], "pager");
    assert_eq!(delivery["kind"], "approval.required");
    assert_eq!(delivery["status"], "failed");
    assert_eq!(delivery["attempts"], 1);
    assert!(
        delivery["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("request failed")),
        "{delivery}"
    );
    let id = delivery["id"].as_str().unwrap().to_owned();
    let listed = ok(phrony(&daemon, "ci").args(["webhooks", "deliveries", "--failed"]));
    let rows = table(&listed);
    assert_eq!(
        rows[0],
        [
            "ID",
            "WEBHOOK",
            "KIND",
            "STATUS",
            "ATTEMPTS",
            "WHEN",
            "LAST ERROR"
        ],
        "{listed}"
    );
    assert_eq!(
        rows[1][..6],
        [
            id.as_str(),
            "pager",
            "approval.required",
            "failed",
            "1",
            "-"
        ]
    );
    assert_eq!(
        ok(phrony(&daemon, "ci").args(["webhooks", "deliveries", "--webhook", "other"])),
        "no deliveries\n"
    );

    // The operator re-queues it: same id, attempts from 0, then it fails again (nobody listens).
    assert_eq!(
        ok(phrony(&daemon, "ops-lead").args(["webhooks", "retry", &id])),
        format!("delivery {id} to pager re-queued (approval.required)\n")
    );
    let again = wait_failed(&daemon, 1, 1);
    assert_eq!(again[0]["id"], id.as_str());
    let audit = ok(phrony(&daemon, "ci").args(["audit", "export"]));
    let retried: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "webhook.retry_requested")
        .collect();
    assert_eq!(retried.len(), 1, "{audit}");
    assert_eq!(retried[0]["stream"], "webhooks");
    assert_eq!(retried[0]["actor"], "ops-lead");
    assert_eq!(retried[0]["payload"]["delivery_id"], id.as_str());

    let unknown = fails(phrony(&daemon, "ops-lead").args([
        "webhooks",
        "retry",
        "00000000-0000-4000-8000-000000000000",
    ]));
    assert!(unknown.contains("not found"), "{unknown}");
    let bad = fails(phrony(&daemon, "ops-lead").args(["webhooks", "retry", "nope"]));
    assert!(bad.contains("is not a delivery id"), "{bad}");

    // `pager` now waits an hour between attempts: the next refund's delivery stays pending.
    let mut daemon = daemon;
    daemon.stop();
    let dead = free_port();
    std::fs::write(
        &file,
        format!(
            "webhooks:\n  - name: pager\n    url: http://127.0.0.1:{dead}/hook\n    events: \
             [approval.required]\n    secret_env: HOOK_SECRET\n    timeout: 1s\n    \
             max_attempts: 5\n    backoff_initial: 1h\n    backoff_max: 1h\n"
        ),
    )
    .unwrap();
    daemon.restart();
    ok(phrony(&daemon, "emad").args(["run", REFUND_AGENT, "--input", "Refund €400 for ORD-7."]));
    let deadline = Instant::now() + Duration::from_secs(60);
    let waiting = loop {
        let pending = deliveries(&daemon, &[]);
        if let Some(d) = pending
            .iter()
            .find(|d| d["status"] == "pending" && d["attempts"] == 1)
        {
            break d.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no pending delivery: {pending:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let waiting_id = waiting["id"].as_str().unwrap().to_owned();

    // The file no longer names `pager`: at the next start its pending delivery is failed, with
    // the reason, in one transaction with its audit record; the failed one keeps its error.
    daemon.stop();
    std::fs::write(
        &file,
        format!(
            "webhooks:\n  - name: other\n    url: http://127.0.0.1:{dead}/other\n    events: \
             [session.failed]\n    secret_env: HOOK_SECRET\n"
        ),
    )
    .unwrap();
    daemon.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    let gone = loop {
        let failed = deliveries(&daemon, &["--failed"]);
        if let Some(d) = failed.iter().find(|d| d["id"] == waiting_id.as_str()) {
            break d.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the pending delivery was not failed: {failed:?}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(gone["webhook"], "pager");
    assert_eq!(gone["attempts"], 1);
    assert_eq!(
        gone["last_error"], "webhook `pager` is no longer configured",
        "{gone}"
    );
    assert!(
        deliveries(&daemon, &[])
            .iter()
            .all(|d| d["status"] != "pending"),
        "no delivery is left pending"
    );
    let table_text = ok(phrony(&daemon, "ci").args(["webhooks", "deliveries", "--failed"]));
    assert!(
        table_text.contains("webhook `pager` is no longer configured"),
        "{table_text}"
    );
    let audit = ok(phrony(&daemon, "ci").args(["audit", "export"]));
    let unconfigured: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "webhook.unconfigured")
        .collect();
    assert_eq!(unconfigured.len(), 1, "{audit}");
    assert_eq!(unconfigured[0]["stream"], "webhooks");
    assert_eq!(unconfigured[0]["actor"], "system:webhooks");
    assert_eq!(unconfigured[0]["payload"]["webhook"], "pager");
    assert_eq!(unconfigured[0]["payload"]["deliveries"], 1);

    // Nothing would send it: an operator retry is refused, naming why; nothing is recorded.
    for stale in [waiting_id.as_str(), id.as_str()] {
        let refused = fails(phrony(&daemon, "ops-lead").args(["webhooks", "retry", stale]));
        assert!(
            refused.contains("webhook `pager` is no longer configured"),
            "{refused}"
        );
    }
    let audit = ok(phrony(&daemon, "ci").args(["audit", "export"]));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"webhook.retry_requested\""))
            .count(),
        1,
        "{audit}"
    );

    // A second start finds nothing more to fail and records nothing.
    daemon.stop();
    daemon.restart();
    std::thread::sleep(Duration::from_millis(500));
    let audit = ok(phrony(&daemon, "ci").args(["audit", "export"]));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"webhook.unconfigured\""))
            .count(),
        1,
        "{audit}"
    );
}

#[test]
fn webhook_deliveries_are_listed_and_retried_sqlite() {
    deliveries_fail_then_are_retried(Backend::Sqlite);
}

#[test]
fn webhook_deliveries_are_listed_and_retried_postgres() {
    deliveries_fail_then_are_retried(Backend::Postgres);
}
