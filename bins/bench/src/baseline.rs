//! Baselines measured in the same run: what the hardware and the RPC stack allow.

use std::time::{Duration, Instant};

use phrony_client::Client;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _};

use crate::BenchError;
use crate::stats::Latencies;

/// Durable SQLite commits per second with the daemon's settings (WAL, `synchronous=FULL`), one
/// small row per transaction, one connection, for `phase`, in a temporary directory (the same
/// filesystem as the daemons' databases).
///
/// # Errors
/// The database cannot be created or written.
pub(crate) fn raw_durable_commits(phase: Duration) -> Result<f64, BenchError> {
    let dir = tempfile::tempdir().map_err(|e| BenchError::new(format!("tempdir: {e}")))?;
    let path = dir.path().join("raw.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))?;
    runtime.block_on(async move {
        let fail = |what: &str, e: sqlx::Error| BenchError::new(format!("raw SQLite {what}: {e}"));
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .connect()
            .await
            .map_err(|e| fail("open", e))?;
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .execute(&mut conn)
            .await
            .map_err(|e| fail("create", e))?;
        let started = Instant::now();
        let mut commits: u64 = 0;
        while started.elapsed() < phase {
            let mut tx = conn.begin().await.map_err(|e| fail("begin", e))?;
            sqlx::query("INSERT INTO t (body) VALUES ('{\"event\":\"tool.completed\"}')")
                .execute(&mut *tx)
                .await
                .map_err(|e| fail("insert", e))?;
            tx.commit().await.map_err(|e| fail("commit", e))?;
            commits += 1;
        }
        conn.close().await.map_err(|e| fail("close", e))?;
        Ok(commits as f64 / started.elapsed().as_secs_f64())
    })
}

/// `samples` sequential unary round trips (`Health/Check`) to the daemon behind `client`.
///
/// # Errors
/// A failed call.
pub(crate) async fn unary_rtt(client: &Client, samples: usize) -> Result<Latencies, BenchError> {
    let mut latencies = Latencies::default();
    for _ in 0..samples {
        let started = Instant::now();
        client
            .health()
            .await
            .map_err(|e| BenchError::new(format!("health check: {e}")))?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}
