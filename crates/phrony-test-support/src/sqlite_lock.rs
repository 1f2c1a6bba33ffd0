//! Another process's hold on an SQLite database's write lock, as a backup tool or a stray
//! `sqlite3` shell would take it: `BEGIN IMMEDIATE` on a connection of its own, kept until
//! released.
//!
//! ```no_run
//! use phrony_test_support::sqlite_lock::SqliteWriteLock;
//! # fn demo(db: &std::path::Path) {
//! let lock = SqliteWriteLock::hold(db).expect("the write lock"); // writers now wait, then fail
//! lock.release(); // (or drop it)
//! # }
//! ```
//!
//! The connection lives on a thread of its own with its own runtime, so the lock can be taken
//! and released from synchronous code and from inside a Tokio runtime alike.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, Executor as _};

/// How long taking the lock may wait for the writer holding it now.
const TAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The write lock of one SQLite database, held until [`release`](Self::release) or drop.
#[derive(Debug)]
pub struct SqliteWriteLock {
    release: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SqliteWriteLock {
    /// Opens `path` (which must exist) and takes its write lock, waiting up to 30 s for the
    /// current writer; returns once the lock is held.
    ///
    /// # Errors
    /// When the database cannot be opened or the lock is not had in time.
    pub fn hold(path: &Path) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(TAKE_TIMEOUT);
        let (held_tx, held_rx) = mpsc::channel::<Result<(), sqlx::Error>>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = held_tx.send(Err(sqlx::Error::Io(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let mut conn = match options.connect().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        let _ = held_tx.send(Err(e));
                        return;
                    }
                };
                if let Err(e) = conn.execute("BEGIN IMMEDIATE").await {
                    let _ = held_tx.send(Err(e));
                    return;
                }
                let _ = held_tx.send(Ok(()));
                // Held until released or the value is dropped (the sender goes with it).
                let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                let _ = conn.execute("ROLLBACK").await;
                let _ = conn.close().await;
            });
        });
        match held_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                release: Some(release_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(sqlx::Error::PoolClosed)
            }
        }
    }

    /// Releases the lock (rolls back) and waits until the connection is closed.
    pub fn release(mut self) {
        self.release_now();
    }

    fn release_now(&mut self) {
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SqliteWriteLock {
    fn drop(&mut self) {
        self.release_now();
    }
}
