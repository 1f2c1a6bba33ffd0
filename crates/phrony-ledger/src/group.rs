//! Group commit on SQLite: one writer batches concurrent write transactions into one database
//! transaction and one fsync.
//!
//! SQLite takes one writer at a time, and with `synchronous=FULL` every `COMMIT` waits for an
//! fsync, so separate transactions queue on the write lock and on the disk. Here one writer owns
//! the write connection:
//!
//! - the first queued write starts the batch with `BEGIN IMMEDIATE`;
//! - each write runs in its own `SAVEPOINT` inside the batch: the writer lends the connection
//!   to the caller (a [`Lease`]), the caller runs its statements on it and hands it back with
//!   "release" (its body succeeded) or "roll back" (its body failed, or the caller was
//!   cancelled). A rolled-back write undoes only its own savepoint; the others of the batch
//!   stay;
//! - the writer commits when its queue is empty, after [`MAX_BATCH_WRITES`] writes or when the
//!   batch is [`MAX_BATCH_AGE`] old, whichever comes first;
//! - a caller is answered only after the batch's `COMMIT` returned: a write is acknowledged
//!   only when it is durable. A failed `COMMIT` fails every write of the batch with
//!   [`LedgerError::Unavailable`] (nothing of the batch was written);
//! - a write whose body failed after other writes of the same batch ran may have seen their
//!   uncommitted rows (that is what made it fail, say "already decided"); it is answered after
//!   the batch's outcome too, and gets `Unavailable` instead of its own error when the batch
//!   did not commit.
//!
//! Writes still run one at a time and in queue order, so the ordering, sequence and hash-chain
//! guarantees are those of separate transactions. Reads do not go through the writer.
//!
//! The writer runs on a thread of its own (with a single-threaded Tokio runtime), so its blocking
//! calls — `BEGIN IMMEDIATE` waiting out the busy timeout, `COMMIT` waiting for the fsync — never
//! stall the daemon's Tokio workers. On a database file it owns a connection outside the pool,
//! opened with the pool's settings (`synchronous=FULL`, the busy timeout, foreign keys) on its
//! first write and kept: its handle stays locked out of sqlx's worker thread, and `BEGIN`, the
//! savepoints, every statement of the batch's writes and `COMMIT` call SQLite directly (the
//! `sqlite_raw` module), with prepared statements kept across batches. A batch costs no thread
//! hand-off besides those between the writer and its callers. An in-memory database has one
//! connection, the pool's: the writer takes it for each batch. A lease lends the batch's slot
//! of the handle, not the driver's connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{Connection as _, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::error::{LedgerError, Result};
use crate::sqlite_raw::{Locked, RawSlot};

/// A batch commits after this many writes even when more are queued.
pub const MAX_BATCH_WRITES: u32 = 64;

/// A batch commits once it is this old even when more writes are queued.
pub const MAX_BATCH_AGE: Duration = Duration::from_millis(10);

const BEGIN: &str = "BEGIN IMMEDIATE";
const COMMIT: &str = "COMMIT";
const ROLLBACK: &str = "ROLLBACK";
const SAVEPOINT: &str = "SAVEPOINT phrony_write";
const RELEASE: &str = "RELEASE phrony_write";
const ROLLBACK_TO: &str = "ROLLBACK TO phrony_write";

/// What the writer has committed so far (see [`crate::Ledger::group_commit_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Batches committed (each one `COMMIT`, one fsync).
    pub commits: u64,
    /// Write transactions those commits made durable.
    pub writes: u64,
    /// Whether a batch holds the database's write lock right now (between its `BEGIN IMMEDIATE`
    /// and its `COMMIT` or rollback).
    pub holding_write_lock: bool,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    /// 1 while a batch holds the write lock.
    holding: AtomicU64,
}

/// The handle callers queue their writes on. Cheap to clone; the writer's thread ends (closing
/// its connection) when the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct GroupWriter {
    queue: mpsc::UnboundedSender<Message>,
    counters: Arc<Counters>,
}

/// Where the writer's connection comes from.
#[derive(Debug)]
pub(crate) enum Source {
    /// A database file: the writer opens a connection of its own with these options and keeps it.
    File(Box<SqliteConnectOptions>),
    /// An in-memory database, whose only connection is the pool's: taken for each batch.
    Pool(SqlitePool),
}

enum Message {
    Write(Request),
    /// Closes the writer's connection; later writes fail. Answered once it is closed.
    Close(oneshot::Sender<()>),
}

/// A queued write: where to send the lease, and whether it must be a batch of its own.
struct Request {
    alone: bool,
    reply: oneshot::Sender<Result<Lease>>,
}

/// The write connection lent to one caller, inside its own savepoint of the open batch.
/// Dropping it without [`Lease::release`] or [`Lease::roll_back`] (a cancelled caller) rolls
/// its savepoint back.
pub(crate) struct Lease {
    /// The batch's directly called connection (empty once the batch is over).
    slot: RawSlot,
    /// `Some` until the lease is handed back.
    back: Option<oneshot::Sender<Returned>>,
    /// Whether earlier writes of the batch ran before this one (its reads may have seen them).
    after_others: bool,
}

enum Ending {
    Release,
    RollBack,
}

/// A lease handed back to the writer.
struct Returned {
    ending: Ending,
    /// Where the writer answers once the write's fate is known; `None` when nobody waits.
    ack: Option<oneshot::Sender<Result<()>>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("after_others", &self.after_others)
            .finish_non_exhaustive()
    }
}

/// An outage error the writer builds for several callers (a driver error is not `Clone`).
fn unavailable(context: &str, message: impl std::fmt::Display) -> LedgerError {
    LedgerError::Unavailable {
        context: context.to_owned(),
        source: sqlx::Error::Io(std::io::Error::other(message.to_string())),
    }
}

fn writer_stopped() -> LedgerError {
    unavailable("ledger write", "the ledger's writer has stopped")
}

impl GroupWriter {
    /// Starts the writer on a thread of its own.
    pub(crate) fn spawn(source: Source) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            queue: rx,
            counters: counters.clone(),
            carried: None,
            closing: None,
            closed: false,
        };
        let started = std::thread::Builder::new()
            .name("phrony-ledger-writer".to_owned())
            .spawn(move || {
                // Timers only: the writer does no network IO (a pool's acquire has a timeout).
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(run(source, writer)),
                    // Dropping the queue's receiver fails every write with "writer stopped".
                    Err(error) => tracing::error!(%error, "cannot start the ledger writer"),
                }
            });
        if let Err(error) = started {
            tracing::error!(%error, "cannot start the ledger writer's thread");
        }
        Self { queue, counters }
    }

    /// Closes the writer's connection (after the write in progress); later writes fail with
    /// [`LedgerError::Unavailable`].
    pub(crate) async fn close(&self) {
        let (ack, closed) = oneshot::channel();
        if self.queue.send(Message::Close(ack)).is_ok() {
            let _ = closed.await;
        }
    }

    /// Queues a write and waits for its turn: the connection, inside the write's savepoint.
    /// `alone` makes the write a batch of its own (it changes connection state that would
    /// leak into later writes of the batch, e.g. `PRAGMA defer_foreign_keys`).
    pub(crate) async fn begin(&self, alone: bool) -> Result<Lease> {
        let (reply, lease) = oneshot::channel();
        self.queue
            .send(Message::Write(Request { alone, reply }))
            .map_err(|_| writer_stopped())?;
        lease.await.map_err(|_| writer_stopped())?
    }

    pub(crate) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
            holding_write_lock: self.counters.holding.load(Ordering::Relaxed) == 1,
        }
    }
}

impl Lease {
    pub(crate) fn slot(&self) -> &RawSlot {
        &self.slot
    }

    /// Keeps the write and waits until its batch committed.
    pub(crate) async fn release(mut self) -> Result<()> {
        let (ack, done) = oneshot::channel();
        self.hand_back(Ending::Release, Some(ack));
        done.await.map_err(|_| writer_stopped())?
    }

    /// Undoes the write. When other writes of the batch ran before it, waits for the batch:
    /// `Err` when the batch failed, so whatever the caller concluded from the state it saw is
    /// not reported as if that state were durable.
    pub(crate) async fn roll_back(mut self) -> Result<()> {
        if !self.after_others {
            self.hand_back(Ending::RollBack, None);
            return Ok(());
        }
        let (ack, done) = oneshot::channel();
        self.hand_back(Ending::RollBack, Some(ack));
        done.await.map_err(|_| writer_stopped())?
    }

    fn hand_back(&mut self, ending: Ending, ack: Option<oneshot::Sender<Result<()>>>) {
        if let Some(back) = self.back.take() {
            // The writer waits on the other end for as long as a lease is out.
            let _ = back.send(Returned { ending, ack });
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.hand_back(Ending::RollBack, None);
    }
}

/// The batch being built: who waits for its commit.
struct Batch {
    started: Instant,
    writes: u32,
    released: u64,
    waiters: Vec<oneshot::Sender<Result<()>>>,
    /// Set when the transaction can no longer be committed (a savepoint could not be undone).
    broken: Option<String>,
}

/// The writer's end of the queue.
struct Writer {
    queue: mpsc::UnboundedReceiver<Message>,
    counters: Arc<Counters>,
    /// A write that must start the next batch (it runs alone).
    carried: Option<Request>,
    /// A close that arrived while a batch was being filled.
    closing: Option<oneshot::Sender<()>>,
    /// After a close every write is refused.
    closed: bool,
}

/// What the writer does next.
enum Next {
    Write(Request),
    Close(oneshot::Sender<()>),
    /// Every handle is gone.
    End,
}

/// Why the writer stopped using its connection.
enum Served {
    Next(Next),
    /// The connection is in an unknown state: open another for the next write.
    Reopen,
}

fn closed_error() -> LedgerError {
    unavailable("ledger write", "the ledger is closed")
}

impl Writer {
    async fn next(&mut self) -> Next {
        if let Some(request) = self.carried.take() {
            return Next::Write(request);
        }
        if let Some(ack) = self.closing.take() {
            return Next::Close(ack);
        }
        loop {
            match self.queue.recv().await {
                None => return Next::End,
                Some(Message::Close(ack)) => return Next::Close(ack),
                Some(Message::Write(request)) => {
                    if self.closed {
                        let _ = request.reply.send(Err(closed_error()));
                    } else if !request.reply.is_closed() {
                        return Next::Write(request);
                    }
                }
            }
        }
    }

    /// The next write queued now, if it may join the open batch.
    fn try_next(&mut self) -> Option<Request> {
        if self.carried.is_some() || self.closing.is_some() {
            return None;
        }
        match self.queue.try_recv() {
            Ok(Message::Write(request)) => Some(request),
            Ok(Message::Close(ack)) => {
                self.closing = Some(ack);
                None
            }
            Err(_) => None,
        }
    }

    /// Runs batches on one connection until the writer must close it.
    async fn serve(&mut self, locked: &mut Locked<'_>, first: Request) -> Served {
        let mut request = first;
        loop {
            if !self.batch(locked, request).await {
                return Served::Reopen;
            }
            request = match self.next().await {
                Next::Write(request) => request,
                other => return Served::Next(other),
            };
        }
    }

    /// One batch: `BEGIN IMMEDIATE`, the queued writes, `COMMIT`. `false` when the connection
    /// was left in an unknown state.
    async fn batch(&mut self, locked: &mut Locked<'_>, first: Request) -> bool {
        if let Err(e) = locked.run(BEGIN) {
            self.fail_queued(first, LedgerError::from_sqlx("begin transaction", e));
            return !locked.in_transaction();
        }
        self.counters.holding.store(1, Ordering::Relaxed);
        let batch = self.fill(locked, first).await;
        let healthy = commit(locked, batch, &self.counters);
        self.counters.holding.store(0, Ordering::Relaxed);
        healthy
    }

    /// Runs queued writes in the open batch until it should commit.
    async fn fill(&mut self, locked: &mut Locked<'_>, first: Request) -> Batch {
        let mut batch = Batch {
            started: Instant::now(),
            writes: 0,
            released: 0,
            waiters: Vec::new(),
            broken: None,
        };
        let slot = locked.lend();
        let mut next = Some(first);
        while let Some(request) = next.take().or_else(|| self.try_next()) {
            if request.alone && batch.writes > 0 {
                self.carried = Some(request);
                break;
            }
            let alone = request.alone;
            lend(&slot, request, &mut batch).await;
            if batch.broken.is_some()
                || alone
                || batch.writes >= MAX_BATCH_WRITES
                || batch.started.elapsed() >= MAX_BATCH_AGE
            {
                break;
            }
        }
        locked.take_back();
        // No write may end the batch's transaction itself; if one did, what it "committed" is
        // not the batch's to acknowledge.
        if batch.broken.is_none() && !locked.in_transaction() {
            batch.broken = Some("a write ended the batch's transaction".to_owned());
        }
        batch
    }

    /// Answers a write whose batch could not start. When the database is unavailable (locked
    /// by another process past the busy timeout, unreachable), every write queued now would
    /// wait as long to fail the same way, so they all get the outage at once, as concurrent
    /// transactions each waiting for the lock did.
    fn fail_queued(&mut self, first: Request, error: LedgerError) {
        if error.is_unavailable() {
            let message = error.to_string();
            while let Some(request) = self.try_next() {
                let _ = request
                    .reply
                    .send(Err(unavailable("begin transaction", &message)));
            }
        }
        let _ = first.reply.send(Err(error));
    }

    /// Marks the writer closed and answers the close.
    fn close(&mut self, ack: oneshot::Sender<()>) {
        self.closed = true;
        let _ = ack.send(());
    }
}

async fn run(source: Source, writer: Writer) {
    match source {
        Source::File(options) => run_on_file(&options, writer).await,
        Source::Pool(pool) => run_on_pool(&pool, writer).await,
    }
}

/// The writer on a database file: its own connection, opened for the first write and kept.
async fn run_on_file(options: &SqliteConnectOptions, mut writer: Writer) {
    let mut next = writer.next().await;
    loop {
        let first = match next {
            Next::End => return,
            Next::Close(ack) => {
                writer.close(ack);
                next = writer.next().await;
                continue;
            }
            Next::Write(request) => request,
        };
        let mut conn = match SqliteConnection::connect_with(options).await {
            Ok(conn) => conn,
            Err(e) => {
                writer.fail_queued(
                    first,
                    LedgerError::from_sqlx("open the write connection", e),
                );
                next = writer.next().await;
                continue;
            }
        };
        let served = match conn.lock_handle().await {
            // `Locked` finalizes its statements and gives the handle back when dropped, at
            // the end of this arm.
            Ok(handle) => writer.serve(&mut Locked::new(handle), first).await,
            Err(e) => {
                let _ = first
                    .reply
                    .send(Err(LedgerError::from_sqlx("lock the write connection", e)));
                Served::Reopen
            }
        };
        if let Err(error) = conn.close().await {
            tracing::warn!(%error, "closing the ledger writer's connection failed");
        }
        next = match served {
            Served::Next(next) => next,
            Served::Reopen => writer.next().await,
        };
    }
}

/// The writer on an in-memory database: the pool's connection, taken for each batch.
async fn run_on_pool(pool: &SqlitePool, mut writer: Writer) {
    loop {
        let first = match writer.next().await {
            Next::End => return,
            Next::Close(ack) => {
                writer.close(ack);
                continue;
            }
            Next::Write(request) => request,
        };
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                writer.fail_queued(first, LedgerError::from_sqlx("acquire connection", e));
                continue;
            }
        };
        let healthy = match conn.lock_handle().await {
            Ok(handle) => writer.batch(&mut Locked::new(handle), first).await,
            Err(e) => {
                let _ = first
                    .reply
                    .send(Err(LedgerError::from_sqlx("lock the write connection", e)));
                false
            }
        };
        if !healthy {
            conn.close_on_drop();
        }
    }
}

/// Runs one write of the batch: opens its savepoint, lends the connection, and settles the
/// savepoint when the lease comes back.
async fn lend(slot: &RawSlot, request: Request, batch: &mut Batch) {
    if request.reply.is_closed() {
        return;
    }
    if let Err(e) = slot.run(SAVEPOINT, &[], None) {
        let _ = request
            .reply
            .send(Err(LedgerError::from_sqlx("begin savepoint", e)));
        return;
    }
    let (back, returned) = oneshot::channel();
    let lease = Lease {
        slot: slot.clone(),
        back: Some(back),
        after_others: batch.writes > 0,
    };
    batch.writes += 1;
    // A caller that stopped waiting drops the lease, which hands it back as a rollback.
    let _ = request.reply.send(Ok(lease));
    let Ok(Returned { ending, ack }) = returned.await else {
        // Cannot happen (a lease hands itself back when dropped); the savepoint's state is
        // unknown, so the batch must not commit.
        batch.broken = Some("a write's lease was lost".to_owned());
        return;
    };
    match ending {
        Ending::Release => match slot.run(RELEASE, &[], None) {
            Ok(_) => {
                batch.released += 1;
                batch.waiters.extend(ack);
            }
            Err(e) => {
                undo_savepoint(slot, batch);
                if let Some(ack) = ack {
                    let _ = ack.send(Err(LedgerError::from_sqlx("release savepoint", e)));
                }
            }
        },
        Ending::RollBack => {
            undo_savepoint(slot, batch);
            batch.waiters.extend(ack);
        }
    }
}

/// `ROLLBACK TO` and `RELEASE` the write's savepoint; when that fails the transaction is in an
/// unknown state and the batch must not commit.
fn undo_savepoint(slot: &RawSlot, batch: &mut Batch) {
    for sql in [ROLLBACK_TO, RELEASE] {
        if let Err(e) = slot.run(sql, &[], None) {
            batch.broken = Some(format!("undo a failed write: {e}"));
            return;
        }
    }
}

/// Commits the batch (or rolls it back when it is broken) and answers every waiter: only after
/// `COMMIT` returned, i.e. once the batch is durable. `false` when a failed batch could not
/// be rolled back (the connection's state is unknown).
fn commit(locked: &mut Locked<'_>, mut batch: Batch, counters: &Counters) -> bool {
    let started = Instant::now();
    let outcome = match batch.broken.take() {
        Some(reason) => Err(reason),
        None => locked.run(COMMIT).map_err(|e| e.to_string()),
    };
    match outcome {
        Ok(()) => {
            phrony_metrics::LEDGER_COMMIT.observe(started.elapsed());
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.writes.fetch_add(batch.released, Ordering::Relaxed);
            for waiter in batch.waiters {
                let _ = waiter.send(Ok(()));
            }
            true
        }
        Err(reason) => {
            tracing::warn!(
                error = %reason,
                writes = batch.writes,
                "ledger group commit failed; failing every write of the batch"
            );
            let mut healthy = true;
            if locked.in_transaction()
                && let Err(error) = locked.run(ROLLBACK)
            {
                tracing::warn!(%error, "rollback after a failed group commit failed");
                healthy = false;
            }
            let message = format!(
                "a batch of {} writes did not commit: {reason}",
                batch.writes
            );
            for waiter in batch.waiters {
                let _ = waiter.send(Err(unavailable("commit transaction", &message)));
            }
            healthy
        }
    }
}
