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
    let log = daemon.logged("generated a new audit key in").await;
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
    assert_eq!(daemon.terminate().await.code(), Some(0));

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
    assert_eq!(daemon.terminate().await.code(), Some(0));
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
    assert_eq!(daemon.terminate().await.code(), Some(0));
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
    assert_eq!(daemon.terminate().await.code(), Some(0));

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
    assert_eq!(daemon.terminate().await.code(), Some(0));
    // While it is stopped, on the log it sealed.
    tokens(&["revoke", "ci-viewer"]);
    tokens(&["create", "--name", "ops", "--role", "admin"]);
    let (code, stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("verified "), "{stdout}");
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().await.code(), Some(0));
}

/// An audit key file readable by others is named as the audit key file (not the secrets key
/// file) in the warning, by the offline verifier that reads it.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_audit_key_file_is_named_in_the_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().await.code(), Some(0));
    let key_file = find_file(home.path(), "audit.key").expect("the daemon created audit.key");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, stdout, stderr) = offline_verify(&launch);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("the audit key file is readable by other users; run chmod 600 on it"),
        "{stderr}"
    );
    assert!(!stderr.contains("secrets key file"), "{stderr}");
}

/// The first file called `name` under `dir`.
fn find_file(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// An attacker deletes a whole stream (the `tokens` stream: its events with the triggers
/// dropped and put back, its `streams` and `chain_heads` rows, the token row): every chain and
/// head left verifies, but the sealed stream set does not — the daemon refuses to start and the
/// offline verifier names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_with_its_head_is_refused_at_start() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().await.code(), Some(0));
    let out = launch
        .command()
        .args([
            "tokens",
            "create",
            "--name",
            "ci-viewer",
            "--role",
            "viewer",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let pool = SqlitePool::connect(&url).await.unwrap();
    for sql in [
        "DROP TRIGGER events_no_update",
        "DROP TRIGGER events_no_delete",
        "DELETE FROM events WHERE stream = 'tokens'",
        "DELETE FROM streams WHERE stream = 'tokens'",
        "DELETE FROM chain_heads WHERE stream = 'tokens'",
        "DELETE FROM api_tokens",
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN \
         SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END",
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN \
         SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    pool.close().await;

    let (code, stdout, stderr) = offline_verify(&launch);
    assert_ne!(code, Some(0), "{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("a whole stream was deleted"),
        "{stdout}{stderr}"
    );
    let (status, stderr) = launch.run(&[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("a whole stream was deleted"), "{stderr}");
    assert!(
        stderr.contains("RUNTIME_ALLOW_UNVERIFIED_LOG=1"),
        "{stderr}"
    );
}
