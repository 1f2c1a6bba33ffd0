//! The audit against an attacker with write access to the SQLite file: the real daemon refuses
//! a rewritten log at start (and serves it only with the recorded override), and the offline
//! `phrony-runtime audit verify` names the problem; through `VerifyAudit` an edited projection
//! is named by table and column, and `ExportAudit` returns every event with its hashes.

use std::process::Stdio;

use crate::support::{Launch, agent_ref, compile_agent, sqlite_url};
use phrony_proto::runtime::v1 as pb;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sqlx::{Row as _, SqlitePool};

const AGENT_STREAM: &str = "agent:support/refund-agent";

/// `phrony-runtime audit verify` on the database: (exit code, stdout, stderr).
fn offline_verify(launch: &Launch) -> (Option<i32>, String, String) {
    let out = launch
        .command()
        .args(["audit", "verify", "--all"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The event hash (`phrony.event.v1`, with the attribution appended when recorded), computed
/// the way an attacker who read the docs would.
fn event_hash(row: &sqlx::sqlite::SqliteRow, payload: &str, prev: &str) -> String {
    let payload: Value = serde_json::from_str(payload).unwrap();
    let mut encoded = json!([
        "phrony.event.v1",
        row.get::<String, _>("stream"),
        row.get::<i64, _>("seq"),
        row.get::<String, _>("type"),
        row.get::<String, _>("ts"),
        row.get::<String, _>("actor"),
        row.get::<Option<String>, _>("call_id"),
        row.get::<Option<i64>, _>("turn"),
        payload,
        prev,
    ]);
    // An attributed event appends its verification and relay (the ledger's documented rule).
    if let Some(verification) = row.get::<Option<String>, _>("actor_verification") {
        let items = encoded.as_array_mut().unwrap();
        items.push(json!(verification));
        items.push(json!(row.get::<Option<String>, _>("actor_via")));
    }
    hex::encode(Sha256::digest(encoded.to_string().as_bytes()))
}

/// Drops the triggers, changes the owner in the agent's first event, recomputes that stream's
/// chain and both heads it can write (`streams`, `chain_heads.hash`), and restores the triggers.
async fn rewrite_agent_stream(url: &str) {
    let pool = SqlitePool::connect(url).await.unwrap();
    sqlx::query("DROP TRIGGER events_no_update")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DROP TRIGGER events_no_delete")
        .execute(&pool)
        .await
        .unwrap();
    let rows = sqlx::query("SELECT * FROM events WHERE stream = ? ORDER BY seq")
        .bind(AGENT_STREAM)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(rows.len() >= 2);
    let mut prev = "0".repeat(64);
    for row in &rows {
        let mut payload: String = row.get("payload");
        if row.get::<i64, _>("seq") == 1 {
            assert!(payload.contains("\"owner\":\"payments-team\""), "{payload}");
            payload = payload.replace("\"owner\":\"payments-team\"", "\"owner\":\"mallory-inc\"");
        }
        let hash = event_hash(row, &payload, &prev);
        sqlx::query(
            "UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE stream = ? AND seq = ?",
        )
        .bind(&payload)
        .bind(&prev)
        .bind(&hash)
        .bind(AGENT_STREAM)
        .bind(row.get::<i64, _>("seq"))
        .execute(&pool)
        .await
        .unwrap();
        prev = hash;
    }
    for sql in [
        "UPDATE streams SET last_hash = ? WHERE stream = ?",
        "UPDATE chain_heads SET hash = ? WHERE stream = ?",
    ] {
        sqlx::query(sql)
            .bind(&prev)
            .bind(AGENT_STREAM)
            .execute(&pool)
            .await
            .unwrap();
    }
    for sql in [
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN \
         SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END",
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN \
         SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

#[tokio::test]
async fn a_rewritten_chain_is_refused_at_start_and_found_offline() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));

    let mut daemon = launch.start().await;
    let log = daemon.stderr();
    assert!(log.contains("generated a new audit key in"), "{log}");
    let key_path = home.path().join("audit.key");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let mut client = daemon.client().await;
    let manifest = compile_agent(&home.path().join("v1"), "0.1.0", "Handle refund requests.");
    client
        .publish(pb::PublishRequest {
            manifest,
            actor: "alice".into(),
        })
        .await
        .unwrap();
    client
        .deploy(pb::DeployRequest {
            agent_ref: Some(agent_ref("0.1.0")),
            actor: "alice".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap();
    // Through the daemon: a clean log, counted exactly (the key introduction + 2 events).
    let report = client
        .verify_audit(pb::VerifyAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (report.verified, report.events, report.streams),
        (true, 3, 2)
    );
    // The export streams every event with its hashes.
    let mut export = client
        .export_audit(pb::ExportAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut exported = Vec::new();
    while let Some(e) = export.message().await.unwrap() {
        exported.push(e);
    }
    assert_eq!(exported.len(), 3);
    assert!(
        exported
            .iter()
            .all(|e| e.hash.len() == 64 && e.prev_hash.len() == 64)
    );
    // (stream, seq) order: the agent stream, then the audit stream.
    assert_eq!(
        (exported[0].stream.as_str(), exported[1].seq),
        (AGENT_STREAM, 2)
    );
    assert_eq!(exported[1].prev_hash, exported[0].hash);
    assert_eq!(exported[2].r#type, "audit.key_introduced");
    assert_eq!(daemon.terminate().code(), Some(0));

    let (code, stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "verified 3 events in 2 streams\n");

    rewrite_agent_stream(&url).await;

    // Offline: the recomputed chain verifies, its forged head does not.
    let (code, stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "audit verification failed: stream {AGENT_STREAM} seq 2: the head's MAC does not \
             verify with the audit key"
        )),
        "{stderr}"
    );

    // The daemon refuses to serve it, in one line naming the stream and the override.
    let (status, stderr) = launch.run(&[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("phrony-runtime: error:"))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(
        line.contains("the event log failed its audit check"),
        "{line}"
    );
    assert!(
        line.contains(&format!("stream {AGENT_STREAM} seq 2")),
        "{line}"
    );
    assert!(line.contains("RUNTIME_ALLOW_UNVERIFIED_LOG=1"), "{line}");

    // The override serves it, says so, and records it.
    let mut daemon = launch
        .clone()
        .env("RUNTIME_ALLOW_UNVERIFIED_LOG", "1")
        .start()
        .await;
    assert!(
        daemon.stderr().contains("FAILED its audit check"),
        "{}",
        daemon.stderr()
    );
    assert_eq!(daemon.terminate().code(), Some(0));
    let pool = SqlitePool::connect(&url).await.unwrap();
    let recorded: Vec<String> =
        sqlx::query("SELECT type FROM events WHERE stream = 'audit' ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get("type"))
            .collect();
    assert_eq!(
        recorded,
        [
            "audit.key_introduced",
            "audit.unverified_log_allowed",
            "audit.key_introduced"
        ]
    );
    pool.close().await;
    // Re-sealed: the next start needs no override.
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().code(), Some(0));
}

#[tokio::test]
async fn an_edited_projection_and_a_dropped_trigger_are_reported() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));
    let mut daemon = launch.start().await;
    let mut client = daemon.client().await;
    let manifest = compile_agent(&home.path().join("v1"), "0.1.0", "Handle refund requests.");
    client
        .publish(pb::PublishRequest {
            manifest,
            actor: "alice".into(),
        })
        .await
        .unwrap();
    let pool = SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE agents SET owner = 'mallory-inc'")
        .execute(&pool)
        .await
        .unwrap();
    let report = client
        .verify_audit(pb::VerifyAuditRequest {
            agent: "support/refund-agent".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!report.verified);
    let problem = report.problem.unwrap();
    assert_eq!(
        (
            problem.kind.as_str(),
            problem.table.as_str(),
            problem.column.as_str()
        ),
        ("projection", "agents", "owner")
    );
    assert!(
        problem
            .message
            .contains("stored \"mallory-inc\", the events say \"payments-team\""),
        "{problem:?}"
    );
    sqlx::query("UPDATE agents SET owner = 'payments-team'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DROP TRIGGER events_no_delete")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(daemon.terminate().code(), Some(0));

    let (code, _stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("the append-only trigger events_no_delete on events is missing"),
        "{stderr}"
    );
    let (status, stderr) = launch.run(&[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("events_no_delete"), "{stderr}");
}

/// `phrony-runtime tokens …` run beside the daemon (before its first start, and while it is
/// stopped) append under the same audit key: the log still verifies offline and the daemon
/// starts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_changes_made_offline_keep_the_log_sealed() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));
    let tokens = |args: &[&str]| {
        let out = launch
            .command()
            .arg("tokens")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tokens {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Before the daemon ever ran: the key is created and the (empty) log sealed.
    tokens(&["create", "--name", "ci-viewer", "--role", "viewer"]);
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().code(), Some(0));
    // While it is stopped, on the log it sealed.
    tokens(&["revoke", "ci-viewer"]);
    tokens(&["create", "--name", "ops", "--role", "admin"]);
    let (code, stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("verified "), "{stdout}");
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().code(), Some(0));
}
