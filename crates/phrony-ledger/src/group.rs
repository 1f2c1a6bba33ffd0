//! Group commit on SQLite: one writer task batches concurrent write transactions into one
//! database transaction and one fsync.
//!
//! SQLite takes one writer at a time, and with `synchronous=FULL` every `COMMIT` waits for an
//! fsync, so separate transactions queue on the write lock and on the disk. Here one task (the
//! writer) owns the write connection while a batch is open:
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
//!   did not commit;
//! - on a database file, a write begins only while its filesystem has the ledger's free-space
//!   reserve (`space.rs`); below it each write fails with [`LedgerError::Unavailable`] before
//!   anything is written, except an exempt one (always rolled back, or the start-up audit check);
//! - each commit is signalled to the checkpoint task (`checkpoint.rs`), which copies the WAL back
//!   into the database off the writer, so that no `COMMIT` does it in the usual course.
//!
//! Writes still run one at a time and in queue order, so the ordering, sequence and hash-chain
//! guarantees are those of separate transactions. Reads do not go through the writer.
//!
//! The writer locks its connection's handle out of the driver's worker thread
//! ([`sqlx::sqlite::LockedSqliteHandle`]) and calls SQLite directly (the `sqlite_raw` module):
//! the savepoints and every statement of the batch's writes run on the writing task's thread,
//! with no thread hand-off per statement; `BEGIN IMMEDIATE` (which may wait for another
//! process's write lock) and `COMMIT` (which waits for the fsync) run on a blocking thread. A
//! lease lends that handle, through a slot emptied when the batch ends, not the driver's
//! connection. On a database file the writer keeps the connection from batch to batch: the
//! statements it prepared stay prepared and its page cache is not reset by another
//! connection's commits; [`GroupWriter::close`] gives it back before the pool closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqlitePool;
use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::Checkpoints;
use crate::error::{LedgerError, Result};
use crate::space::DiskFloor;
use crate::sqlite_raw::{Locked, PreparedTexts, RawSlot};

/// A batch commits after this many writes even when more are queued.
pub const MAX_BATCH_WRITES: u32 = 64;

/// A batch commits once it is this old even when more writes are queued.
pub const MAX_BATCH_AGE: Duration = Duration::from_millis(10);

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
    /// WAL checkpoints run by the ledger's checkpoint task (off the writer; a database file
    /// only), and those of them that copied the whole WAL back into the database.
    pub checkpoints: u64,
    /// See [`GroupCommitStats::checkpoints`].
    pub complete_checkpoints: u64,
    /// Commits that no complete checkpoint has copied back yet. At 0 the next write starts the
    /// WAL over from its beginning; under sustained writes a passive checkpoint rarely catches
    /// up, and the WAL grows to the automatic checkpoint's bound.
    pub uncheckpointed_commits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    /// 1 while a batch holds the write lock.
    holding: AtomicU64,
}

/// The handle callers queue their writes on. Cheap to clone; the writer task stops when the
/// last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct GroupWriter {
    queue: mpsc::UnboundedSender<Message>,
    counters: Arc<Counters>,
    checkpoints: Option<Checkpoints>,
}

/// What the writer task works with besides its queue and connection.
struct Context {
    counters: Arc<Counters>,
    /// The SQL texts its batches prepare are recorded here.
    recorded: PreparedTexts,
    /// A batch begins only when the database's filesystem has its reserve of free space.
    floor: Option<DiskFloor>,
    /// Told of every commit: checkpoints the WAL off the writer.
    checkpoints: Option<Checkpoints>,
}

/// A queued write: where to send the lease, whether it must be a batch of its own, and whether
/// it may run below the free-space reserve (`exempt`: the start-up audit check, which seals a
/// few rows at most).
struct Request {
    alone: bool,
    exempt: bool,
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
    /// When the writer lent it: the write's task times its hand-off from here.
    lent: Instant,
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
    /// When the write handed it back: the writer times its hand-off from here.
    sent: Instant,
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
        error: sqlx::Error::Io(std::io::Error::other(message.to_string())),
    }
}

fn writer_stopped() -> LedgerError {
    unavailable("ledger write", "the ledger's writer has stopped")
}

impl GroupWriter {
    /// Starts the writer task on the current Tokio runtime. It takes its connection from
    /// `pool` and, with `hold`, keeps it (and the statements it prepared) from batch to batch
    /// until [`GroupWriter::close`] or a connection error; without, it gives it back after each
    /// batch (an in-memory database's pool has its only connection to share with the reads).
    /// The SQL texts its batches prepare are recorded in `recorded`. With a `floor`, a batch
    /// begins only while the filesystem has its reserve free (else its writes fail with
    /// `Unavailable`); `checkpoints` is told of every commit.
    pub(crate) fn spawn(
        pool: SqlitePool,
        hold: bool,
        recorded: PreparedTexts,
        floor: Option<DiskFloor>,
        checkpoints: Option<Checkpoints>,
    ) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let context = Context {
            counters: counters.clone(),
            recorded,
            floor,
            checkpoints: checkpoints.clone(),
        };
        tokio::spawn(run(pool, hold, rx, context));
        Self {
            queue,
            counters,
            checkpoints,
        }
    }

    /// Gives the held connection back to the pool (after the batch in progress), so that the
    /// pool can close; a later write takes a connection again (and fails once the pool is
    /// closed).
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.queue.send(Message::Close(ack)).is_ok() {
            let _ = done.await;
        }
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.close().await;
        }
    }

    /// Queues a write and waits for its turn: the connection, inside the write's savepoint.
    /// `alone` makes the write a batch of its own (it changes connection state that would
    /// leak into later writes of the batch, e.g. `PRAGMA defer_foreign_keys`).
    pub(crate) async fn begin(&self, alone: bool) -> Result<Lease> {
        self.enqueue(alone, false).await
    }

    /// [`GroupWriter::begin`] for a transaction that may run below the free-space reserve:
    /// one its caller always rolls back, or the start-up audit check (a few rows at most).
    pub(crate) async fn begin_exempt(&self) -> Result<Lease> {
        self.enqueue(false, true).await
    }

    async fn enqueue(&self, alone: bool, exempt: bool) -> Result<Lease> {
        let asked = Instant::now();
        let (reply, lease) = oneshot::channel();
        self.queue
            .send(Message::Write(Request {
                alone,
                exempt,
                reply,
            }))
            .map_err(|_| writer_stopped())?;
        let lease = lease.await.map_err(|_| writer_stopped())??;
        phrony_metrics::LEDGER_WRITE_WAIT.observe(asked.elapsed());
        phrony_metrics::LEDGER_WRITE_HANDOFF.observe(lease.lent.elapsed());
        Ok(lease)
    }

    pub(crate) fn stats(&self) -> GroupCommitStats {
        let checkpoints = self
            .checkpoints
            .as_ref()
            .map(Checkpoints::counts)
            .unwrap_or_default();
        GroupCommitStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
            holding_write_lock: self.counters.holding.load(Ordering::Relaxed) == 1,
            checkpoints: checkpoints.ran,
            complete_checkpoints: checkpoints.completed,
            uncheckpointed_commits: checkpoints.behind,
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
            let _ = back.send(Returned {
                ending,
                ack,
                sent: Instant::now(),
            });
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
    /// Why only exempt transactions may run in this batch (the free-space reserve).
    refusing: Option<String>,
}

/// What the writer's queue carries.
enum Message {
    Write(Request),
    /// Give the held connection back to the pool (the ledger is closing); answered once it is.
    Close(oneshot::Sender<()>),
}

async fn run(
    pool: SqlitePool,
    hold: bool,
    mut queue: mpsc::UnboundedReceiver<Message>,
    context: Context,
) {
    let mut carried: Option<Message> = None;
    // One connection per turn of this loop: held for every batch while `hold` (its statements
    // stay prepared and its page cache warm), for one batch otherwise.
    loop {
        let first = match next_write(&mut carried, &mut queue).await {
            Next::Write(request) => request,
            Next::Close(ack) => {
                let _ = ack.send(());
                continue;
            }
            Next::Stopped => return,
        };
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                let error = LedgerError::from_sqlx("acquire connection", e);
                fail_queued(first, &mut queue, &mut carried, error);
                continue;
            }
        };
        let (healthy, closing) =
            serve(&mut conn, hold, first, &mut queue, &mut carried, &context).await;
        if !healthy {
            conn.close_on_drop();
        }
        drop(conn);
        if let Some(ack) = closing {
            let _ = ack.send(());
        }
    }
}

/// Runs batches on `conn` (from `first`): one, or with `hold` every one until a close, the last
/// handle's drop or a connection error. Whether the connection may be reused, and the close to
/// answer once it is back in the pool.
async fn serve(
    conn: &mut PoolConnection<Sqlite>,
    hold: bool,
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Message>,
    carried: &mut Option<Message>,
    context: &Context,
) -> (bool, Option<oneshot::Sender<()>>) {
    let mut locked = match conn.lock_handle().await {
        Ok(handle) => Locked::new(handle, context.recorded.clone()),
        Err(e) => {
            let _ = first
                .reply
                .send(Err(LedgerError::from_sqlx("lock the write connection", e)));
            return (false, None);
        }
    };
    let mut next = Some(first);
    loop {
        let first = match next.take() {
            Some(request) => request,
            None => match next_write(carried, queue).await {
                Next::Write(request) => request,
                Next::Close(ack) => return (true, Some(ack)),
                Next::Stopped => return (true, None),
            },
        };
        // Dropping `locked` on the way out rolls back whatever is open and finalizes the
        // statements before sqlx gets the handle back.
        match batch(&mut locked, first, queue, carried, context).await {
            Turn::Again if hold => {}
            Turn::Again => return (true, None),
            Turn::Broken => return (false, None),
        }
    }
}

enum Next {
    Write(Request),
    Close(oneshot::Sender<()>),
    /// Every handle is gone.
    Stopped,
}

/// The next write to run (skipping those whose caller stopped waiting), or a close.
async fn next_write(
    carried: &mut Option<Message>,
    queue: &mut mpsc::UnboundedReceiver<Message>,
) -> Next {
    loop {
        let message = match carried.take() {
            Some(message) => message,
            None => match queue.recv().await {
                Some(message) => message,
                None => return Next::Stopped,
            },
        };
        match message {
            Message::Write(request) if request.reply.is_closed() => {}
            Message::Write(request) => return Next::Write(request),
            Message::Close(ack) => return Next::Close(ack),
        }
    }
}

/// What a batch left of the connection.
enum Turn {
    /// Ready for the next batch.
    Again,
    /// In a state nobody should reuse (a transaction that could not be ended).
    Broken,
}

/// Runs one batch on the locked connection: `BEGIN IMMEDIATE`, the queued writes (from
/// `first`) until the batch should commit, `COMMIT`, and the answers to every waiter.
async fn batch(
    locked: &mut Locked<'_>,
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Message>,
    carried: &mut Option<Message>,
    context: &Context,
) -> Turn {
    // Below the free-space reserve no write begins: each fails as an outage, with nothing
    // written (see `space.rs`); an exempt transaction still runs.
    let refusing = match context.floor.as_ref().map(|f| f.check("begin transaction")) {
        Some(Err(error)) if !first.exempt => {
            let _ = first.reply.send(Err(error));
            return Turn::Again;
        }
        Some(Err(error)) => Some(error.to_string()),
        _ => None,
    };
    let counters = &*context.counters;
    let slot = locked.open_batch();
    let begun = Instant::now();
    // Off the runtime's threads: the busy handler may sleep up to the busy timeout while
    // another process holds the write lock.
    if let Err(e) = off_thread(&slot, "begin transaction", "BEGIN IMMEDIATE").await {
        let error = LedgerError::from_sqlx("begin transaction", e);
        fail_queued(first, queue, carried, error);
        locked.close_batch();
        return if locked.in_transaction() {
            Turn::Broken
        } else {
            Turn::Again
        };
    }
    counters.holding.store(1, Ordering::Relaxed);
    let batch = fill(&slot, locked, first, queue, carried, refusing).await;
    let turn = commit(&slot, locked, batch, counters, context.checkpoints.as_ref()).await;
    phrony_metrics::LEDGER_BATCH.observe(begun.elapsed());
    counters.holding.store(0, Ordering::Relaxed);
    locked.close_batch();
    turn
}

/// Runs `sql` on a blocking thread (a `COMMIT` waits for the fsync, a `BEGIN IMMEDIATE` for the
/// write lock), so no runtime thread waits for the disk.
async fn off_thread(
    slot: &RawSlot,
    context: &'static str,
    sql: &'static str,
) -> std::result::Result<(), sqlx::Error> {
    let slot = slot.clone();
    tokio::task::spawn_blocking(move || slot.run(context, sql, &[], None).map(drop))
        .await
        .map_err(|e| sqlx::Error::Io(std::io::Error::other(format!("{sql} did not finish: {e}"))))?
}

/// Runs queued writes in the open batch until it should commit.
async fn fill(
    slot: &RawSlot,
    locked: &mut Locked<'_>,
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Message>,
    carried: &mut Option<Message>,
    refusing: Option<String>,
) -> Batch {
    let mut batch = Batch {
        started: Instant::now(),
        writes: 0,
        released: 0,
        waiters: Vec::new(),
        broken: None,
        refusing,
    };
    let mut next = Some(first);
    loop {
        let request = match next.take() {
            Some(request) => request,
            None => match queue.try_recv() {
                Ok(Message::Write(request)) => request,
                Ok(close @ Message::Close(_)) => {
                    *carried = Some(close);
                    break;
                }
                Err(_) => break,
            },
        };
        if request.alone && batch.writes > 0 {
            *carried = Some(Message::Write(request));
            break;
        }
        let alone = request.alone;
        lend(slot, request, &mut batch).await;
        if batch.broken.is_some()
            || alone
            || batch.writes >= MAX_BATCH_WRITES
            || batch.started.elapsed() >= MAX_BATCH_AGE
        {
            break;
        }
    }
    // No write may end the batch's transaction itself; if one did, what it "committed" is
    // not the batch's to acknowledge.
    if batch.broken.is_none() && !locked.in_transaction() {
        batch.broken = Some("a write ended the batch's transaction".to_owned());
    }
    batch
}

/// Answers a write whose batch could not start. When the database is unavailable (locked by
/// another process past the busy timeout, unreachable), every write queued now would wait as
/// long to fail the same way, so they all get the outage at once, as concurrent transactions
/// each waiting for the lock did. A close found in the queue is kept for the writer's loop.
fn fail_queued(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Message>,
    carried: &mut Option<Message>,
    error: LedgerError,
) {
    if error.is_unavailable() {
        let message = error.to_string();
        while carried.is_none()
            && let Ok(next) = queue.try_recv()
        {
            match next {
                Message::Write(request) => {
                    let _ = request
                        .reply
                        .send(Err(unavailable("begin transaction", &message)));
                }
                close @ Message::Close(_) => *carried = Some(close),
            }
        }
    }
    let _ = first.reply.send(Err(error));
}

/// Runs one write of the batch: opens its savepoint, lends the connection, and settles the
/// savepoint when the lease comes back.
async fn lend(slot: &RawSlot, request: Request, batch: &mut Batch) {
    if request.reply.is_closed() {
        return;
    }
    if let Some(reason) = &batch.refusing
        && !request.exempt
    {
        let _ = request
            .reply
            .send(Err(unavailable("begin transaction", reason)));
        return;
    }
    if let Err(e) = slot.run("begin savepoint", SAVEPOINT, &[], None) {
        let _ = request
            .reply
            .send(Err(LedgerError::from_sqlx("begin savepoint", e)));
        return;
    }
    let (back, returned) = oneshot::channel();
    let lent = Instant::now();
    let lease = Lease {
        slot: slot.timed(),
        back: Some(back),
        after_others: batch.writes > 0,
        lent,
    };
    batch.writes += 1;
    // A caller that stopped waiting drops the lease, which hands it back as a rollback.
    let _ = request.reply.send(Ok(lease));
    let returned = returned.await;
    phrony_metrics::LEDGER_WRITE_HOLD.observe(lent.elapsed());
    let Ok(Returned { ending, ack, sent }) = returned else {
        // Cannot happen (a lease hands itself back when dropped); the savepoint's state is
        // unknown, so the batch must not commit.
        batch.broken = Some("a write's lease was lost".to_owned());
        return;
    };
    // The write's hand-off back, inside its hold.
    phrony_metrics::LEDGER_WRITE_HANDOFF.observe(sent.elapsed());
    match ending {
        Ending::Release => match slot.run("release savepoint", RELEASE, &[], None) {
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
        if let Err(e) = slot.run("undo a failed write", sql, &[], None) {
            batch.broken = Some(format!("undo a failed write: {e}"));
            return;
        }
    }
}

/// Commits the batch (or rolls it back when it is broken) and answers every waiter; `Broken`
/// when the transaction could not be ended.
async fn commit(
    slot: &RawSlot,
    locked: &mut Locked<'_>,
    mut batch: Batch,
    counters: &Counters,
    checkpoints: Option<&Checkpoints>,
) -> Turn {
    let started = std::time::Instant::now();
    let outcome = match batch.broken.take() {
        Some(reason) => Err(reason),
        None => off_thread(slot, "commit transaction", "COMMIT")
            .await
            .map_err(|e| e.to_string()),
    };
    match outcome {
        Ok(()) => {
            phrony_metrics::LEDGER_COMMIT.observe(started.elapsed());
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.writes.fetch_add(batch.released, Ordering::Relaxed);
            if let Some(checkpoints) = checkpoints {
                checkpoints.committed();
            }
            for waiter in batch.waiters {
                let _ = waiter.send(Ok(()));
            }
            Turn::Again
        }
        Err(reason) => {
            tracing::warn!(
                error = %reason,
                writes = batch.writes,
                "ledger group commit failed; failing every write of the batch"
            );
            let mut turn = Turn::Again;
            // A rollback in WAL mode only drops the batch's frames: no wait for the disk.
            if locked.in_transaction()
                && let Err(error) = slot.run("roll back a failed batch", "ROLLBACK", &[], None)
            {
                tracing::warn!(%error, "rollback after a failed group commit failed");
                turn = Turn::Broken;
            }
            let message = format!(
                "a batch of {} writes did not commit: {reason}",
                batch.writes
            );
            for waiter in batch.waiters {
                let _ = waiter.send(Err(unavailable("commit transaction", &message)));
            }
            turn
        }
    }
}
