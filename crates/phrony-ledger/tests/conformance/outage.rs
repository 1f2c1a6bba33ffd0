//! Storage outages on a SQLite file: another process's connection holds the write lock past the
//! busy timeout. The write probe and every write report `Unavailable` (not a lost race, not an
//! internal error), the writable signal turns `false` at once, and both recover by themselves
//! when the lock is released.

use std::str::FromStr as _;
use std::time::Duration;

use phrony_ledger::{AgentRef, Ledger, LedgerError, LedgerOptions, NewAgentVersion};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Executor as _};

fn version(agent: &AgentRef, version: &str) -> NewAgentVersion {
    NewAgentVersion {
        namespace: agent.namespace.clone(),
        name: agent.name.clone(),
        version: version.into(),
        owner: "team".into(),
        labels: Default::default(),
        snapshot_json: r#"{"kind":"Agent"}"#.into(),
        content_hash: format!("hash-{version}"),
        actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
    }
}

#[tokio::test]
async fn a_write_lock_held_by_another_connection_makes_writes_unavailable_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let ledger = Ledger::connect_with(
        &url,
        LedgerOptions {
            sqlite_busy_timeout: Duration::from_millis(300),
            probe_busy_timeout: Duration::from_millis(100),
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    let agent = AgentRef::new("support", "refunds");
    ledger
        .publish_agent_version(version(&agent, "1.0.0"))
        .await
        .unwrap();
    ledger.probe_write().await.unwrap();
    let mut writable = ledger.writable();
    assert!(*writable.borrow_and_update());

    // Another connection (as another process would) takes the write lock and keeps it.
    let mut holder = SqliteConnectOptions::from_str(&url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    holder.execute("BEGIN EXCLUSIVE").await.unwrap();

    let probe = ledger.probe_write().await.unwrap_err();
    assert!(probe.is_unavailable(), "{probe:?}");
    assert!(!ledger.is_writable());
    assert!(writable.has_changed().unwrap(), "the signal fired");
    assert!(!*writable.borrow_and_update());

    // A real write: unavailable, not retried as a lost race, not an internal error.
    let write = ledger
        .publish_agent_version(version(&agent, "1.1.0"))
        .await
        .unwrap_err();
    assert!(
        matches!(write, LedgerError::Unavailable { .. }),
        "{write:?}"
    );
    assert!(
        ledger.last_outage().is_some_and(|m| m.contains("locked")),
        "{:?}",
        ledger.last_outage()
    );
    // Reads still work (WAL): only writing is impossible.
    assert!(ledger.get_agent(&agent).await.is_ok());

    holder.execute("COMMIT").await.unwrap();
    ledger.probe_write().await.unwrap();
    assert!(ledger.is_writable());
    assert!(*writable.borrow_and_update());
    ledger
        .publish_agent_version(version(&agent, "1.1.0"))
        .await
        .unwrap();
}

/// A failed write marks the ledger not writable and the next successful write marks it
/// writable again, without a probe: the signal follows every write.
#[tokio::test]
async fn the_writable_signal_follows_ordinary_writes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let ledger = Ledger::connect_with(
        &url,
        LedgerOptions {
            sqlite_busy_timeout: Duration::from_millis(100),
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    let agent = AgentRef::new("support", "refunds");
    let mut holder = SqliteConnectOptions::from_str(&url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    holder.execute("BEGIN EXCLUSIVE").await.unwrap();
    let err = ledger
        .publish_agent_version(version(&agent, "1.0.0"))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(!ledger.is_writable());
    // A refused request says nothing about the storage.
    holder.execute("COMMIT").await.unwrap();
    let refused = ledger
        .publish_agent_version(NewAgentVersion {
            version: String::new(),
            ..version(&agent, "x")
        })
        .await
        .unwrap_err();
    assert!(matches!(refused, LedgerError::InvalidArgument { .. }));
    assert!(!ledger.is_writable());
    ledger
        .publish_agent_version(version(&agent, "1.0.0"))
        .await
        .unwrap();
    assert!(ledger.is_writable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_our_own_writes_is_not_an_outage() {
    // The probe's own connection may wait longer than its busy timeout for the write lock
    // while this process's group commit takes batch after batch: the database is taking
    // writes, so health must not say otherwise (a burst of 1,000 approvals once made the
    // daemon call itself unavailable and stall its sessions).
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let ledger = Ledger::connect_with(
        &url,
        LedgerOptions {
            probe_busy_timeout: Duration::from_millis(20),
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16 {
        let ledger = ledger.clone();
        let stop = std::sync::Arc::clone(&stop);
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ledger
                    .append_session_event(
                        &format!("burst-{w}"),
                        phrony_ledger::NewEvent::new(
                            "bench.tick",
                            "system",
                            serde_json::json!({"n": n}),
                        ),
                    )
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut probes = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        ledger.probe_write().await.unwrap();
        assert!(ledger.is_writable());
        probes += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = 0;
    for w in writers {
        written += w.await.unwrap();
    }
    assert!(
        probes > 0 && written > 100,
        "{probes} probes, {written} writes"
    );
}
