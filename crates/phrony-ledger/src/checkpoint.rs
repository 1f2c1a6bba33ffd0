//! WAL checkpoints off the writer.
//!
//! In WAL mode every commit appends the pages it changed to the `-wal` file; a checkpoint
//! copies them back into the database file, after which the WAL is reused from its start. Left
//! to itself, SQLite checkpoints inside the `COMMIT` that takes the WAL past
//! `wal_autocheckpoint` pages (1,000 by default): that commit — and with it the single
//! group-commit writer and every write queued behind it — waits for pages to be copied and the
//! database file to be synced. Measured under load, that made a third of the writer's busy time.
//!
//! Here a task of its own checkpoints instead: on its own connection, `PRAGMA
//! wal_checkpoint(PASSIVE)` (which takes no lock a writer needs and waits for nobody) once
//! after commits, at most every [`INTERVAL`]. The automatic checkpoint stays as a bound at
//! [`AUTOCHECKPOINT_PAGES`], for when the task falls behind (a long read pins an old snapshot,
//! the task's connection cannot be opened). A checkpoint that fails is retried after the next
//! commit; it loses nothing (the pages stay in the WAL, which readers and recovery use).
//!
//! SQLite starts the WAL over only when a write begins after a checkpoint copied *every* frame.
//! When writes pause, the next checkpoint does, and the WAL stays a few intervals' worth of
//! commits; under sustained writes a passive checkpoint rarely reaches the WAL's end, and the
//! WAL grows to the automatic checkpoint's bound (≈ 16 MiB) while its pages are still copied
//! off the writer. (A `RESTART` checkpoint here kept it near 4 MiB but measured no throughput
//! change: see BENCHMARKS.md.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions as _, Connection as _, Row as _};
use tokio::sync::{Notify, mpsc, oneshot};

/// The shortest time between two checkpoints: frequent enough that a pause in the writes
/// soon lets the WAL start over, rare enough that each one copies many commits' pages at
/// once. (At 20 ms the bench measured no gain and more CPU per call.)
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// The automatic checkpoint's threshold (pages of WAL) on the ledger's connections: a bound for
/// when the task falls behind, not the usual path.
pub(crate) const AUTOCHECKPOINT_PAGES: &str = "4000";

/// What [`Checkpoints::counts`] reports.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) ran: u64,
    pub(crate) completed: u64,
    pub(crate) behind: u64,
}

/// The handle the writer signals its commits on. Cheap to clone; the task stops when
/// [`Checkpoints::close`] is called or the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Checkpoints {
    shared: Arc<Shared>,
    close: mpsc::Sender<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// A permit when commits happened since the last checkpoint began.
    committed: Notify,
    /// Checkpoints that completed (every frame of the WAL copied) / ran.
    completed: AtomicU64,
    ran: AtomicU64,
    /// Commits signalled so far, and how many of them the latest complete checkpoint covered
    /// (it began after they committed).
    commits: AtomicU64,
    covered: AtomicU64,
}

impl Checkpoints {
    /// Starts the task on the current Tokio runtime; it connects to the database `options`
    /// name on its first checkpoint.
    pub(crate) fn spawn(options: SqliteConnectOptions) -> Self {
        let shared = Arc::new(Shared::default());
        let (close, closes) = mpsc::channel(1);
        tokio::spawn(run(options, shared.clone(), closes));
        Self { shared, close }
    }

    /// Tells the task that a commit added to the WAL (called after the `COMMIT`, before its
    /// writers are told, so that a writer that has its answer is counted).
    pub(crate) fn committed(&self) {
        self.shared.commits.fetch_add(1, Ordering::AcqRel);
        self.shared.committed.notify_one();
    }

    /// Checkpoints run so far, those of them that copied the whole WAL, and the commits no
    /// complete checkpoint has covered yet.
    pub(crate) fn counts(&self) -> Counts {
        let covered = self.shared.covered.load(Ordering::Acquire);
        Counts {
            ran: self.shared.ran.load(Ordering::Relaxed),
            completed: self.shared.completed.load(Ordering::Relaxed),
            behind: self
                .shared
                .commits
                .load(Ordering::Acquire)
                .saturating_sub(covered),
        }
    }

    /// Stops the task and closes its connection (after a checkpoint in progress).
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.close.send(ack).await.is_ok() {
            let _ = done.await;
        }
    }
}

async fn run(
    options: SqliteConnectOptions,
    shared: Arc<Shared>,
    mut closes: mpsc::Receiver<oneshot::Sender<()>>,
) {
    let mut conn: Option<SqliteConnection> = None;
    let mut failing = false;
    let ack = loop {
        tokio::select! {
            ack = closes.recv() => break ack,
            () = shared.committed.notified() => {}
        }
        checkpoint(&options, &mut conn, &shared, &mut failing).await;
        tokio::select! {
            ack = closes.recv() => break ack,
            () = tokio::time::sleep(INTERVAL) => {}
        }
    };
    if let Some(conn) = conn
        && let Err(error) = conn.close().await
    {
        tracing::debug!(%error, "closing the WAL checkpoint connection failed");
    }
    if let Some(ack) = ack {
        let _ = ack.send(());
    }
}

async fn checkpoint(
    options: &SqliteConnectOptions,
    conn: &mut Option<SqliteConnection>,
    shared: &Shared,
    failing: &mut bool,
) {
    let started = Instant::now();
    // Read before the checkpoint begins: every commit counted here is in the WAL it copies.
    let through = shared.commits.load(Ordering::Acquire);
    let outcome = match conn {
        Some(conn) => passive(conn).await,
        None => match options.connect().await {
            Ok(opened) => passive(conn.insert(opened)).await,
            Err(error) => Err(error),
        },
    };
    match outcome {
        Ok((busy, log, copied)) => {
            phrony_metrics::LEDGER_CHECKPOINT.observe(started.elapsed());
            shared.ran.fetch_add(1, Ordering::Relaxed);
            if busy == 0 && copied == log {
                shared.completed.fetch_add(1, Ordering::Relaxed);
                shared.covered.fetch_max(through, Ordering::AcqRel);
            }
            if std::mem::take(failing) {
                tracing::info!("WAL checkpoints succeed again");
            }
        }
        Err(error) => {
            // A connection that failed may be in any state: the next checkpoint opens another.
            *conn = None;
            if !std::mem::replace(failing, true) {
                tracing::warn!(
                    %error,
                    "WAL checkpoint failed; the WAL keeps the pages and the next commit retries"
                );
            }
        }
    }
}

/// One passive checkpoint: whether it was blocked, the WAL's frames and how many are copied.
async fn passive(conn: &mut SqliteConnection) -> Result<(i64, i64, i64), sqlx::Error> {
    // Stepped to its end (not `fetch_one`), so that the statement holds nothing afterwards.
    let rows = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_all(&mut *conn)
        .await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}
