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

/// A ledger on a small filesystem (a tmpfs of `size_mib`), keeping `reserve` bytes free.
async fn ledger_on_small_fs(
    size_mib: u32,
    reserve: u64,
) -> Option<(phrony_test_support::small_fs::SmallFs, Ledger, String)> {
    let fs = phrony_test_support::small_fs::SmallFs::mount(size_mib)?;
    let file = fs.path().join("ledger.db");
    let url = format!("sqlite://{}", file.display());
    let ledger = Ledger::connect_with(
        &url,
        LedgerOptions {
            sqlite_min_free_bytes: reserve,
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    Some((fs, ledger, url))
}

/// `PRAGMA integrity_check` on a connection of its own.
async fn integrity(url: &str) -> String {
    use sqlx::Row as _;
    let mut conn = SqliteConnectOptions::from_str(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let row = sqlx::query("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    row.get::<String, _>(0)
}

/// Below the free-space reserve nothing begins: the probe and every write fail as an outage
/// naming the space left, before anything is written, and both succeed again once space is
/// freed. A full disk is seen at once, not when some write first needs a new page (a one-row
/// upsert like the probe's can keep succeeding in WAL space already allocated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_free_space_reserve_nothing_is_written_until_space_is_freed() {
    let Some((mut fs, ledger, url)) = ledger_on_small_fs(16, 4 * 1024 * 1024).await else {
        return;
    };
    let agent = AgentRef::new("support", "refunds");
    ledger
        .publish_agent_version(version(&agent, "1.0.0"))
        .await
        .unwrap();
    ledger.probe_write().await.unwrap();

    assert!(fs.fill() > 0);
    let probe = ledger.probe_write().await.unwrap_err();
    assert!(probe.is_unavailable(), "{probe:?}");
    let text = probe.to_string();
    assert!(
        text.contains("bytes available, below the 4194304 bytes"),
        "{text}"
    );
    assert!(!ledger.is_writable());
    let write = ledger
        .publish_agent_version(version(&agent, "1.1.0"))
        .await
        .unwrap_err();
    assert!(write.is_unavailable(), "{write:?}");
    assert!(
        ledger
            .last_outage()
            .is_some_and(|m| m.contains("RUNTIME_SQLITE_MIN_FREE_BYTES")),
        "{:?}",
        ledger.last_outage()
    );
    // Reads go on.
    assert_eq!(ledger.list_agent_versions(&agent).await.unwrap().len(), 1);
    // An up-to-date database opens: migrating it again writes nothing.
    let reopened = Ledger::connect_with(
        &url,
        LedgerOptions {
            sqlite_min_free_bytes: 4 * 1024 * 1024,
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap();
    reopened.migrate().await.unwrap();
    assert_eq!(reopened.list_agent_versions(&agent).await.unwrap().len(), 1);
    reopened.close().await;

    fs.free();
    ledger.probe_write().await.unwrap();
    assert!(ledger.is_writable());
    ledger
        .publish_agent_version(version(&agent, "1.1.0"))
        .await
        .unwrap();
    let versions: Vec<String> = ledger
        .list_agent_versions(&agent)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(versions.len(), 2, "{versions:?}");
    ledger.close().await;
    assert_eq!(integrity(&url).await, "ok");
}

/// With no reserve (`sqlite_min_free_bytes: 0`), a full disk fails the write that needs new
/// space — as an outage, with nothing of it written — while the WAL checkpoint cannot grow
/// the database file; every write acknowledged before is kept, and writing resumes once space
/// is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_reserve_a_full_disk_fails_the_write_needing_space_and_nothing_is_half_written() {
    let Some((mut fs, ledger, url)) = ledger_on_small_fs(16, 0).await else {
        return;
    };
    let agent = AgentRef::new("support", "refunds");
    let big = |n: usize| NewAgentVersion {
        // 64 KiB per version: new pages, never room left in old ones.
        snapshot_json: format!(r#"{{"kind":"Agent","pad":"{}"}}"#, "x".repeat(64 * 1024)),
        ..version(&agent, &format!("1.0.{n}"))
    };
    ledger.publish_agent_version(big(0)).await.unwrap();
    assert!(fs.fill() > 0);
    let mut acknowledged = vec!["1.0.0".to_owned()];
    let mut failed = None;
    for n in 1..=256 {
        match ledger.publish_agent_version(big(n)).await {
            Ok(_) => acknowledged.push(format!("1.0.{n}")),
            Err(e) => {
                failed = Some((n, e));
                break;
            }
        }
    }
    let (n, error) = failed.expect("256 × 64 KiB never fit on a full 16 MiB filesystem");
    assert!(error.is_unavailable(), "{error:?}");
    assert!(!ledger.is_writable());

    fs.free();
    ledger.publish_agent_version(big(n)).await.unwrap();
    acknowledged.push(format!("1.0.{n}"));
    let mut versions: Vec<String> = ledger
        .list_agent_versions(&agent)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.version)
        .collect();
    versions.sort();
    acknowledged.sort();
    assert_eq!(versions, acknowledged);
    ledger.close().await;
    assert_eq!(integrity(&url).await, "ok");
}

/// The checkpoint task copies the WAL back into the database after commits (at most every
/// 100 ms); when the writes pause it catches up with every commit, the next write starts the
/// WAL over, and the file stays the size of one burst of writes instead of growing to the
/// automatic checkpoint's bound inside some commit. (Waiting for it is exact: the writer counts
/// its commits before it answers, the task the commits its complete checkpoints began after.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_off_the_writer_and_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ledger.db");
    let ledger = Ledger::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    let agent = AgentRef::new("support", "refunds");
    caught_up(&ledger).await;
    let before = ledger.group_commit_stats().unwrap();
    // 300 versions of 8 KiB (≈ 27 KiB of pages each: the version, its event, their indexes):
    // ≈ 8 MiB through the WAL, in 20 bursts of 15 (≈ 400 KiB each), the task checkpointing
    // during and between them.
    for burst in 0..20 {
        for n in 0..15 {
            ledger
                .publish_agent_version(NewAgentVersion {
                    snapshot_json: format!(
                        r#"{{"kind":"Agent","pad":"{}"}}"#,
                        "y".repeat(8 * 1024)
                    ),
                    ..version(&agent, &format!("1.{burst}.{n}"))
                })
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The writes pause: a checkpoint of the task copies every commit back, and the next
        // write starts the WAL over.
        caught_up(&ledger).await;
    }
    let after = ledger.group_commit_stats().unwrap();
    assert!(
        after.complete_checkpoints >= before.complete_checkpoints + 20,
        "{before:?} → {after:?}"
    );
    let wal = std::fs::metadata(dir.path().join("ledger.db-wal"))
        .unwrap()
        .len();
    // Without the task the WAL would hold every page written (below the automatic
    // checkpoint's 16 MiB bound); with it, one burst's worth (the migrations' ≈ 1 MiB the
    // largest).
    assert!(wal < 2 * 1024 * 1024, "the WAL grew to {wal} bytes");
    ledger.close().await;
}

/// Waits (bounded) until a complete checkpoint of the task has covered every commit so far.
async fn caught_up(ledger: &Ledger) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stats = ledger.group_commit_stats().unwrap();
        if stats.uncheckpointed_commits == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no checkpoint caught up with the commits within 20 s: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
