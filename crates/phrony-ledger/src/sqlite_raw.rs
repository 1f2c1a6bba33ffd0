//! Direct SQLite calls on the group-commit writer's connection, without a thread hand-off per
//! statement.
//!
//! sqlx runs each SQLite statement on the connection's own worker thread: every statement is a
//! message to that thread and a wake-up back, and a ledger write costs several statements.
//! Profiles showed the hand-offs, not SQLite, taking most of the daemon's CPU. The group-commit
//! writer locks its connection's handle out of sqlx's worker thread
//! ([`sqlx::sqlite::LockedSqliteHandle`]) for as long as it holds the connection, and every
//! statement of its batches runs here, through the `libsqlite3-sys` the driver itself links.
//!
//! Safety rests on two rules: the raw handle is used only through a [`RawSlot`] (one per
//! batch, emptied when the batch ends: a use after that finds it empty and fails with "the
//! batch is over"; a use during it holds the slot's mutex, which the writer waits for), and
//! [`Locked`]'s `Drop` finalizes every statement prepared here (after rolling back a
//! transaction left open) before it gives the handle back to sqlx.
//!
//! Pooled reads on a database file take the same direct path ([`RawReadPool`]): read-only
//! connections this module opens and owns itself (sqlx never sees them), each used by one
//! caller at a time under its slot's mutex, their prepared statements kept for the
//! connection's life (at most [`MAX_CACHED_SQL`] texts) and finalized before it is closed.
//! A read runs on the calling task's thread; in WAL mode a reader never waits for the writer,
//! so it blocks the thread only for the statement's own work.
//!
//! Every SQL text prepared on these connections is recorded once ([`PreparedTexts`], at most
//! [`MAX_RECORDED_SQL`] texts) so that its query plan can be checked
//! ([`RawSlot::explain_query_plan`], `crate::plans`).
//! This is the only `unsafe` code of the workspace.
#![allow(
    unsafe_code,
    reason = "FFI calls to the SQLite library on a handle locked out of sqlx's worker thread; \
              every block states why it is sound"
)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use libsqlite3_sys as ffi;
use sqlx::sqlite::LockedSqliteHandle;

use crate::error::RawSqliteError;

fn error(e: RawSqliteError) -> sqlx::Error {
    sqlx::Error::Database(Box::new(e))
}

/// One value as SQLite stores it: a column of a result row, or a parameter to bind (`db.rs`
/// converts its bind values with the driver's encoding for SQLite).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RawValue {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl RawValue {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::Null => "NULL",
            Self::Integer(_) => "INTEGER",
            Self::Real(_) => "REAL",
            Self::Text(_) => "TEXT",
            Self::Blob(_) => "BLOB",
        }
    }
}

/// A result row of a direct query.
#[derive(Debug, Clone)]
pub(crate) struct RawRow {
    columns: Arc<[String]>,
    values: Vec<RawValue>,
}

impl RawRow {
    /// The value of `column`; `Err` names a column the statement does not return.
    pub(crate) fn get(&self, column: &str) -> Result<&RawValue, String> {
        self.columns
            .iter()
            .position(|c| c == column)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| format!("no column named {column:?} in the result"))
    }
}

/// A prepared statement owned by a [`RawConn`].
struct Stmt(NonNull<ffi::sqlite3_stmt>);

/// SQL texts whose statements a connection keeps prepared; preparing one more first finalizes
/// them all (a read connection lives long, and the ledger's statements are a fixed set well
/// below this, so the bound only guards against texts built per call).
const MAX_CACHED_SQL: usize = 512;

/// At most this many distinct SQL texts are recorded by a [`PreparedTexts`]. The ledger's
/// statements are a fixed set of a few hundred texts; a text built per call (an `IN (…)` list
/// or a batch of events, one text per length) adds one text per shape, and once the bound is
/// reached further texts are only counted ([`PreparedTexts::snapshot`]), so the record never
/// grows past it.
pub(crate) const MAX_RECORDED_SQL: usize = 2048;

/// The SQL texts prepared on direct connections (writers' and read connections), each with the
/// context of the run that first prepared it: what `Ledger::explain_prepared_statements`
/// explains. The ledger records into one per process ([`PreparedTexts::of_process`]). A text
/// is recorded when a connection prepares it (a cache miss; the writer prepares its texts once
/// per batch), never per run, and looked up before anything is allocated.
#[derive(Debug, Clone, Default)]
pub(crate) struct PreparedTexts(Arc<Mutex<Recorded>>);

#[derive(Debug, Default)]
struct Recorded {
    /// Context by SQL text.
    texts: HashMap<String, &'static str>,
    /// Preparations of texts left out because `texts` was full.
    unrecorded: u64,
}

impl PreparedTexts {
    /// The record of this process: every ledger opened on SQLite records its texts here.
    pub(crate) fn of_process() -> Self {
        static PROCESS: std::sync::LazyLock<PreparedTexts> =
            std::sync::LazyLock::new(PreparedTexts::default);
        PROCESS.clone()
    }

    fn record(&self, context: &'static str, sql: &str) {
        let mut recorded = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if recorded.texts.contains_key(sql) {
            return;
        }
        if recorded.texts.len() >= MAX_RECORDED_SQL {
            recorded.unrecorded += 1;
            return;
        }
        recorded.texts.insert(sql.to_owned(), context);
    }

    /// The recorded texts as (context, SQL), sorted by context then SQL, and how many
    /// preparations of texts were left out (0 unless the bound was reached).
    pub(crate) fn snapshot(&self) -> (Vec<(&'static str, String)>, u64) {
        let recorded = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut texts: Vec<(&'static str, String)> = recorded
            .texts
            .iter()
            .map(|(sql, context)| (*context, sql.clone()))
            .collect();
        texts.sort_unstable();
        (texts, recorded.unrecorded)
    }
}

/// A connection called directly: the writer's, locked for one batch, or a read connection of
/// a [`RawReadPool`], owned.
struct RawConn {
    db: NonNull<ffi::sqlite3>,
    /// Prepared statements by SQL text (one per statement of the text), reused across the
    /// connection's uses and finalized when it is dropped (the writer's: when the batch ends).
    statements: HashMap<String, Vec<Stmt>>,
    /// Where the texts it prepares are recorded.
    recorded: PreparedTexts,
    /// Opened by this module (a read connection): closed when dropped.
    owned: bool,
}

// SAFETY: the handle is only used under the slot's mutex, by one thread at a time, and SQLite
// connections (built thread-safe, as libsqlite3-sys bundles it) may move between threads.
unsafe impl Send for RawConn {}

impl Drop for RawConn {
    fn drop(&mut self) {
        self.finalize_statements();
        if self.owned {
            // SAFETY: `db` was opened by `RawReadPool::open`, is used by nobody else (its only
            // owner is being dropped) and has no statement left (so the close cannot be refused
            // as busy); closed exactly once, here.
            unsafe {
                ffi::sqlite3_close(self.db.as_ptr());
            }
        }
    }
}

/// The raw connection of an open batch, shared by the writer and the write that holds the
/// lease; empty once the batch is over.
#[derive(Clone, Default)]
pub(crate) struct RawSlot {
    conn: Arc<Mutex<Option<RawConn>>>,
    /// Whether each statement run through this handle is timed into
    /// `phrony_ledger_write_statement_seconds`: a write's lease of the writer (not the
    /// writer's own `BEGIN`, savepoints and `COMMIT`, nor a read connection).
    timed: bool,
}

impl std::fmt::Debug for RawSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSlot").finish_non_exhaustive()
    }
}

/// The write connection's handle, locked out of sqlx's worker thread for as long as the writer
/// holds the connection (many batches; one when the writer gives the connection back after each
/// batch). The statements prepared on it are kept from batch to batch; each batch reaches the
/// connection through a slot of its own ([`Locked::open_batch`]), emptied when the batch ends,
/// so that a use left over from a batch cannot run in the next one. Dropping it rolls back a
/// transaction left open, finalizes the statements and only then gives the handle back.
pub(crate) struct Locked<'c> {
    /// The connection between batches (`None` while a batch's slot holds it).
    conn: Option<RawConn>,
    /// The open batch's slot (empty between batches).
    slot: RawSlot,
    handle: LockedSqliteHandle<'c>,
}

impl std::fmt::Debug for Locked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked").finish_non_exhaustive()
    }
}

impl<'c> Locked<'c> {
    /// Records the texts the batch prepares in `recorded`.
    pub(crate) fn new(mut handle: LockedSqliteHandle<'c>, recorded: PreparedTexts) -> Self {
        let db = handle.as_raw_handle();
        Self {
            conn: Some(RawConn {
                db,
                statements: HashMap::new(),
                recorded,
                owned: false,
            }),
            slot: RawSlot::default(),
            handle,
        }
    }

    /// A new slot for the next batch, holding the connection (with the statements prepared in
    /// earlier batches); the previous batch's slot is emptied first.
    pub(crate) fn open_batch(&mut self) -> RawSlot {
        self.close_batch();
        self.slot = RawSlot {
            conn: Arc::new(Mutex::new(self.conn.take())),
            timed: false,
        };
        self.slot.clone()
    }

    /// Ends the open batch: empties its slot (waiting for a statement in progress) and keeps
    /// the connection for the next one. Later uses of the batch's slot fail.
    pub(crate) fn close_batch(&mut self) {
        if let Some(conn) = self.slot.take() {
            self.conn = Some(conn);
        }
    }

    /// Whether the connection is inside a transaction (SQLite's autocommit flag is off).
    pub(crate) fn in_transaction(&mut self) -> bool {
        // SAFETY: the handle is locked out of the worker thread while `self` lives; the call
        // only reads the connection's flag.
        unsafe { ffi::sqlite3_get_autocommit(self.handle.as_raw_handle().as_ptr()) == 0 }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Wait for a statement in progress (an off-thread `COMMIT` of a writer dropped while it
        // waited), then roll back what is left open — sqlx counts only the transactions it
        // began itself, so it would not — and finalize everything prepared here; `handle` (a
        // field) is released after this body, so sqlx gets the handle back outside any
        // transaction and with none of our statements open.
        self.close_batch();
        if let Some(mut conn) = self.conn.take() {
            // SAFETY: the handle is locked out of the worker thread; the call reads a flag.
            let open = unsafe { ffi::sqlite3_get_autocommit(conn.db.as_ptr()) == 0 };
            if open
                && let Err(error) = conn.run("roll back an abandoned batch", "ROLLBACK", &[], None)
            {
                tracing::warn!(%error, "could not roll back the write connection's transaction");
            }
            drop(conn);
        }
    }
}

/// What one run of a SQL text produced.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) rows: Vec<RawRow>,
    pub(crate) rows_affected: u64,
}

impl RawSlot {
    /// The SQL texts the slot's connection keeps prepared (none once the batch is over).
    #[cfg(test)]
    pub(crate) fn cached_sql(&self) -> Vec<String> {
        let guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        guard
            .as_ref()
            .map(|conn| conn.statements.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Empties the slot (waiting for a statement in progress): what it held, if anything.
    fn take(&self) -> Option<RawConn> {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Runs `sql` (one or more statements) with `args` bound to `$N` / `?N` / `?` parameters,
    /// keeping at most `max_rows` rows (`None`: all). Stops after the statement that produced
    /// the last wanted row. `context` says what the ledger is doing (its errors name it); a
    /// text prepared here for the first time is recorded with it.
    pub(crate) fn run(
        &self,
        context: &'static str,
        sql: &str,
        args: &[RawValue],
        max_rows: Option<usize>,
    ) -> Result<Outcome, sqlx::Error> {
        let started = self.timed.then(std::time::Instant::now);
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let outcome = conn_of(&mut guard)?.run(context, sql, args, max_rows);
        if let Some(started) = started {
            phrony_metrics::LEDGER_WRITE_STATEMENT.observe(started.elapsed());
        }
        outcome
    }

    /// This slot's connection, each statement run through the handle timed (a write's lease).
    pub(crate) fn timed(&self) -> Self {
        Self {
            conn: Arc::clone(&self.conn),
            timed: true,
        }
    }

    /// The `EXPLAIN QUERY PLAN` of each statement of `sql`, in order: one line per plan node,
    /// indented two spaces per level below the statement's top. The statements are not run,
    /// and nothing is cached or recorded; parameters are left unbound (without `sqlite_stat1` SQLite's plan does not
    /// depend on their values).
    pub(crate) fn explain_query_plan(&self, sql: &str) -> Result<Vec<Vec<String>>, sqlx::Error> {
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn_of(&mut guard)?.explain(sql)
    }
}

fn conn_of(slot: &mut Option<RawConn>) -> Result<&mut RawConn, sqlx::Error> {
    slot.as_mut().ok_or_else(|| {
        sqlx::Error::Io(std::io::Error::other(
            "the ledger write's batch is over; its connection is gone",
        ))
    })
}

/// Read-only connections to the database file for pooled reads, called directly (no hand-off
/// to a driver thread per statement). At most `max` are open at once; an idle one is reused,
/// with the statements it prepared before.
pub(crate) struct RawReadPool {
    filename: CString,
    /// Where the texts its connections prepare are recorded.
    recorded: PreparedTexts,
    busy_timeout_ms: c_int,
    acquire_timeout: Duration,
    idle: Mutex<Vec<RawConn>>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for RawReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawReadPool")
            .field("filename", &self.filename)
            .finish_non_exhaustive()
    }
}

/// One read connection of a [`RawReadPool`], back in the pool when dropped.
pub(crate) struct RawReader {
    slot: RawSlot,
    pool: Arc<RawReadPool>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl std::fmt::Debug for RawReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawReader").finish_non_exhaustive()
    }
}

impl RawReadPool {
    /// A pool of at most `max` read connections to the SQLite file `path` (none opened yet),
    /// each waiting up to `busy_timeout` for a lock, an acquire up to `acquire_timeout`,
    /// recording the texts they prepare in `recorded`.
    ///
    /// # Errors
    /// A path with a NUL byte.
    pub(crate) fn new(
        path: &std::path::Path,
        max: u32,
        busy_timeout: Duration,
        acquire_timeout: Duration,
        recorded: PreparedTexts,
    ) -> Result<Self, String> {
        let filename = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("the SQLite path {} holds a NUL byte", path.display()))?;
        Ok(Self {
            filename,
            recorded,
            busy_timeout_ms: c_int::try_from(busy_timeout.as_millis()).unwrap_or(c_int::MAX),
            acquire_timeout,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(max.max(1)).unwrap_or(1),
            )),
        })
    }

    /// A read connection: an idle one, or a new one while fewer than `max` are open; waits up
    /// to the acquire timeout for one to come back.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<RawReader, sqlx::Error> {
        let permit = tokio::time::timeout(
            self.acquire_timeout,
            Arc::clone(&self.permits).acquire_owned(),
        )
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
        .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open()?,
        };
        Ok(RawReader {
            slot: RawSlot {
                conn: Arc::new(Mutex::new(Some(conn))),
                timed: false,
            },
            pool: Arc::clone(self),
            _permit: permit,
        })
    }

    /// Where the texts this pool's connections (and the writer's) prepare are recorded.
    pub(crate) fn prepared_texts(&self) -> &PreparedTexts {
        &self.recorded
    }

    /// Closes the idle connections; the ones in use close when given back.
    pub(crate) fn close(&self) {
        self.permits.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        drop(idle);
    }

    fn open(&self) -> Result<RawConn, sqlx::Error> {
        let mut db: *mut ffi::sqlite3 = std::ptr::null_mut();
        // SAFETY: `filename` is NUL-terminated; `db` is a valid out-pointer. Read-only: a
        // read connection cannot write even by mistake. No mutex of SQLite's own: the
        // connection is used by one thread at a time, under its slot's mutex.
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                self.filename.as_ptr(),
                &raw mut db,
                ffi::SQLITE_OPEN_READONLY | ffi::SQLITE_OPEN_NOMUTEX,
                std::ptr::null(),
            )
        };
        let Some(db) = NonNull::new(db) else {
            return Err(error(RawSqliteError::new(
                rc,
                "SQLite could not allocate a read connection".to_owned(),
            )));
        };
        // Owned from here: closed on every path out (a failed open still allocates a handle).
        let conn = RawConn {
            db,
            statements: HashMap::new(),
            recorded: self.recorded.clone(),
            owned: true,
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(conn.errmsg()));
        }
        // SAFETY: `db` is open and used only here.
        unsafe {
            ffi::sqlite3_extended_result_codes(db.as_ptr(), 1);
            ffi::sqlite3_busy_timeout(db.as_ptr(), self.busy_timeout_ms);
        }
        Ok(conn)
    }
}

impl RawReader {
    pub(crate) fn slot(&self) -> &RawSlot {
        &self.slot
    }
}

impl Drop for RawReader {
    fn drop(&mut self) {
        let Some(conn) = self.slot.take() else {
            return;
        };
        // SAFETY: `db` is open; the call only reads the connection's state.
        let in_transaction = unsafe { ffi::sqlite3_get_autocommit(conn.db.as_ptr()) == 0 };
        // A connection left inside a transaction (no read path opens one) would pin an old
        // snapshot of the database for every later reader: closed instead of reused.
        if !in_transaction && !self.pool.permits.is_closed() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
    }
}

impl RawConn {
    fn errmsg(&self) -> RawSqliteError {
        // SAFETY: `db` is open and locked to this thread; `sqlite3_errmsg` returns a valid
        // NUL-terminated string (owned by SQLite, copied at once).
        unsafe {
            let code = ffi::sqlite3_extended_errcode(self.db.as_ptr());
            let message = CStr::from_ptr(ffi::sqlite3_errmsg(self.db.as_ptr()))
                .to_string_lossy()
                .into_owned();
            RawSqliteError::new(code, message)
        }
    }

    /// Finalizes every statement prepared on the connection.
    fn finalize_statements(&mut self) {
        for (_, statements) in self.statements.drain() {
            // Each was prepared on `db`, which is still open (the writer's: sqlx closes it only
            // after the handle was given back, after the batch's drop; a read connection's:
            // closed after this), and is finalized exactly once, here.
            finalize_all(statements);
        }
    }

    /// Prepares the first statement of `rest` with `flags`: the statement (`None` when `rest`
    /// starts with nothing but whitespace or a comment) and the bytes it took.
    fn prepare_one(&self, rest: &[u8], flags: u32) -> Result<(Option<Stmt>, usize), sqlx::Error> {
        let len = c_int::try_from(rest.len())
            .map_err(|_| error(RawSqliteError::misuse("SQL text too long")))?;
        let mut stmt: *mut ffi::sqlite3_stmt = std::ptr::null_mut();
        let mut tail: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `rest` is valid for `len` bytes (it need not be NUL-terminated since the
        // length is given); `stmt` and `tail` are valid out-pointers; `tail` points into
        // `rest` on return.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db.as_ptr(),
                rest.as_ptr().cast(),
                len,
                flags,
                &raw mut stmt,
                &raw mut tail,
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(self.errmsg()));
        }
        let consumed = if tail.is_null() {
            rest.len()
        } else {
            // SAFETY: SQLite sets `tail` within `rest` (or one past its end).
            usize::try_from(unsafe { tail.offset_from(rest.as_ptr().cast()) }).unwrap_or(rest.len())
        };
        Ok((NonNull::new(stmt).map(Stmt), consumed))
    }

    fn prepare(&mut self, context: &'static str, sql: &str) -> Result<(), sqlx::Error> {
        if self.statements.contains_key(sql) {
            return Ok(());
        }
        if self.statements.len() >= MAX_CACHED_SQL {
            self.finalize_statements();
        }
        let mut prepared = Vec::new();
        let bytes = sql.as_bytes();
        let mut offset = 0usize;
        while offset < bytes.len() {
            let (stmt, consumed) =
                match self.prepare_one(&bytes[offset..], ffi::SQLITE_PREPARE_PERSISTENT) {
                    Ok(one) => one,
                    Err(e) => {
                        finalize_all(prepared);
                        return Err(e);
                    }
                };
            prepared.extend(stmt);
            if consumed == 0 {
                break;
            }
            offset += consumed;
        }
        self.recorded.record(context, sql);
        self.statements.insert(sql.to_owned(), prepared);
        Ok(())
    }

    /// See [`RawSlot::explain_query_plan`].
    fn explain(&self, sql: &str) -> Result<Vec<Vec<String>>, sqlx::Error> {
        let bytes = sql.as_bytes();
        let mut plans = Vec::new();
        let mut offset = 0usize;
        while offset < bytes.len() {
            let rest = &bytes[offset..];
            let (stmt, consumed) = self.prepare_one(rest, 0)?;
            if let Some(stmt) = stmt {
                finalize_all(vec![stmt]);
                // A statement ends at a `;` or at the end of the text: valid UTF-8.
                let statement = String::from_utf8_lossy(rest.get(..consumed).unwrap_or(rest));
                plans.push(self.query_plan(&format!(
                    "EXPLAIN QUERY PLAN {}",
                    without_explain(&statement)
                ))?);
            }
            if consumed == 0 {
                break;
            }
            offset += consumed;
        }
        Ok(plans)
    }

    /// Runs one `EXPLAIN QUERY PLAN` statement (parameters unbound) and indents each node's
    /// `detail` by its depth.
    fn query_plan(&self, explain: &str) -> Result<Vec<String>, sqlx::Error> {
        let (Some(stmt), _) = self.prepare_one(explain.as_bytes(), 0)? else {
            return Ok(Vec::new());
        };
        let s = stmt.0.as_ptr();
        let mut depth_of: HashMap<i64, usize> = HashMap::new();
        let mut lines = Vec::new();
        let outcome = loop {
            // SAFETY: `s` is a prepared statement of this connection, finalized below.
            match unsafe { ffi::sqlite3_step(s) } {
                ffi::SQLITE_ROW => {
                    // Columns: id, parent, notused, detail.
                    let int = |i| match column_value(s, i) {
                        RawValue::Integer(v) => v,
                        _ => 0,
                    };
                    let (id, parent) = (int(0), int(1));
                    let detail = match column_value(s, 3) {
                        RawValue::Text(t) => t,
                        other => format!("({})", other.type_name()),
                    };
                    let depth = depth_of.get(&parent).map_or(0, |d| d + 1);
                    depth_of.insert(id, depth);
                    lines.push(format!("{}{detail}", "  ".repeat(depth)));
                }
                ffi::SQLITE_DONE => break Ok(lines),
                _ => break Err(error(self.errmsg())),
            }
        };
        finalize_all(vec![stmt]);
        outcome
    }

    fn run(
        &mut self,
        context: &'static str,
        sql: &str,
        args: &[RawValue],
        max_rows: Option<usize>,
    ) -> Result<Outcome, sqlx::Error> {
        self.prepare(context, sql)?;
        let db = self.db;
        let statements = self
            .statements
            .get(sql)
            .ok_or_else(|| error(RawSqliteError::misuse("statement vanished from the cache")))?;
        let mut outcome = Outcome::default();
        for stmt in statements {
            let result = run_one(db, stmt, args, max_rows, &mut outcome);
            // SAFETY: `stmt` belongs to `db`; resetting and clearing bindings leaves it ready
            // for its next use and releases the read/write state the step held.
            unsafe {
                ffi::sqlite3_reset(stmt.0.as_ptr());
                ffi::sqlite3_clear_bindings(stmt.0.as_ptr());
            }
            result.map_err(|e| match e {
                StepError::Sqlite => error(self.errmsg()),
                StepError::Other(e) => error(e),
            })?;
            if max_rows.is_some_and(|max| outcome.rows.len() >= max) {
                break;
            }
        }
        Ok(outcome)
    }
}

/// `statement` without a leading `EXPLAIN` or `EXPLAIN QUERY PLAN` (a diagnostic's own text):
/// its plan is the plan of the statement it explains.
fn without_explain(statement: &str) -> &str {
    fn strip<'s>(text: &'s str, word: &str) -> Option<&'s str> {
        let text = text.trim_start();
        text.get(..word.len())
            .filter(|head| head.eq_ignore_ascii_case(word))
            .and_then(|_| text.get(word.len()..))
    }
    strip(statement, "EXPLAIN").map_or(statement, |rest| {
        strip(rest, "QUERY")
            .and_then(|rest| strip(rest, "PLAN"))
            .unwrap_or(rest)
    })
}

fn finalize_all(statements: Vec<Stmt>) {
    for stmt in statements {
        // SAFETY: prepared on a connection that is still open, owned by the caller and not
        // stored anywhere else.
        unsafe {
            ffi::sqlite3_finalize(stmt.0.as_ptr());
        }
    }
}

enum StepError {
    /// The connection's last error says what.
    Sqlite,
    Other(RawSqliteError),
}

fn run_one(
    db: NonNull<ffi::sqlite3>,
    stmt: &Stmt,
    args: &[RawValue],
    max_rows: Option<usize>,
    outcome: &mut Outcome,
) -> Result<(), StepError> {
    bind(stmt, args)?;
    let s = stmt.0.as_ptr();
    let mut columns: Option<Arc<[String]>> = None;
    loop {
        // SAFETY: `s` is a prepared statement of the locked connection.
        let rc = unsafe { ffi::sqlite3_step(s) };
        match rc {
            ffi::SQLITE_ROW => {
                let names = columns.get_or_insert_with(|| column_names(s)).clone();
                let values = (0..names.len()).map(|i| column_value(s, i)).collect();
                outcome.rows.push(RawRow {
                    columns: names,
                    values,
                });
                if max_rows.is_some_and(|max| outcome.rows.len() >= max) {
                    return Ok(());
                }
            }
            ffi::SQLITE_DONE => {
                // SAFETY: as above; both calls only read the statement's and connection's
                // state.
                let writes = unsafe { ffi::sqlite3_stmt_readonly(s) } == 0;
                if writes {
                    let changes = unsafe { ffi::sqlite3_changes64(db.as_ptr()) };
                    outcome.rows_affected += u64::try_from(changes).unwrap_or_default();
                }
                return Ok(());
            }
            _ => return Err(StepError::Sqlite),
        }
    }
}

fn column_names(s: *mut ffi::sqlite3_stmt) -> Arc<[String]> {
    // SAFETY: `s` is a prepared statement; names are valid NUL-terminated strings until the
    // statement is stepped again, and are copied at once.
    unsafe {
        let count = ffi::sqlite3_column_count(s);
        (0..count)
            .map(|i| {
                let name = ffi::sqlite3_column_name(s, i);
                if name.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(name).to_string_lossy().into_owned()
                }
            })
            .collect()
    }
}

fn column_value(s: *mut ffi::sqlite3_stmt, i: usize) -> RawValue {
    let Ok(i) = c_int::try_from(i) else {
        return RawValue::Null;
    };
    // SAFETY: `s` has a current row (the last step returned SQLITE_ROW) and `i` is below its
    // column count. Text and blob pointers are valid for the byte count SQLite reports, until
    // the next step; both are copied at once.
    unsafe {
        match ffi::sqlite3_column_type(s, i) {
            ffi::SQLITE_INTEGER => RawValue::Integer(ffi::sqlite3_column_int64(s, i)),
            ffi::SQLITE_FLOAT => RawValue::Real(ffi::sqlite3_column_double(s, i)),
            ffi::SQLITE_TEXT => {
                let ptr = ffi::sqlite3_column_text(s, i);
                let len = usize::try_from(ffi::sqlite3_column_bytes(s, i)).unwrap_or_default();
                if ptr.is_null() {
                    RawValue::Text(String::new())
                } else {
                    let bytes = std::slice::from_raw_parts(ptr, len);
                    // The ledger writes only UTF-8: validate fast, replace only what is not.
                    RawValue::Text(match std::str::from_utf8(bytes) {
                        Ok(text) => text.to_owned(),
                        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
                    })
                }
            }
            ffi::SQLITE_BLOB => {
                let ptr = ffi::sqlite3_column_blob(s, i);
                let len = usize::try_from(ffi::sqlite3_column_bytes(s, i)).unwrap_or_default();
                if ptr.is_null() {
                    RawValue::Blob(Vec::new())
                } else {
                    RawValue::Blob(std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec())
                }
            }
            _ => RawValue::Null,
        }
    }
}

/// Binds `args` to the statement's parameters: `$N` and `?N` take the N-th argument, a bare
/// `?` the next one (as the driver does).
fn bind(stmt: &Stmt, args: &[RawValue]) -> Result<(), StepError> {
    let s = stmt.0.as_ptr();
    // SAFETY: `s` is a prepared statement of the locked connection.
    let count = unsafe { ffi::sqlite3_bind_parameter_count(s) };
    let mut next = 0usize;
    for param in 1..=count {
        // SAFETY: `param` is within 1..=count; the name is NUL-terminated or null.
        let name = unsafe {
            let name = ffi::sqlite3_bind_parameter_name(s, param);
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        };
        let index = match name.as_deref() {
            None => {
                next += 1;
                next - 1
            }
            Some(name) => name
                .strip_prefix('$')
                .or_else(|| name.strip_prefix('?'))
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| n.checked_sub(1))
                .ok_or_else(|| {
                    StepError::Other(RawSqliteError::misuse(format!(
                        "unsupported SQL parameter {name:?} (use $1, $2, …)"
                    )))
                })?,
        };
        let arg = args.get(index).ok_or_else(|| {
            StepError::Other(RawSqliteError::misuse(format!(
                "SQL parameter {} has no argument ({} given)",
                index + 1,
                args.len()
            )))
        })?;
        if bind_one(s, param, arg) != ffi::SQLITE_OK {
            return Err(StepError::Sqlite);
        }
    }
    Ok(())
}

fn bind_text(s: *mut ffi::sqlite3_stmt, param: c_int, text: &str) -> c_int {
    // SAFETY: `text` is valid for its length; SQLITE_TRANSIENT makes SQLite copy it before the
    // call returns.
    unsafe {
        ffi::sqlite3_bind_text64(
            s,
            param,
            text.as_ptr().cast(),
            text.len() as u64,
            ffi::SQLITE_TRANSIENT(),
            ffi::SQLITE_UTF8 as u8,
        )
    }
}

fn bind_int(s: *mut ffi::sqlite3_stmt, param: c_int, v: i64) -> c_int {
    // SAFETY: `s` is a prepared statement; `param` is one of its parameters.
    unsafe { ffi::sqlite3_bind_int64(s, param, v) }
}

fn bind_null(s: *mut ffi::sqlite3_stmt, param: c_int) -> c_int {
    // SAFETY: as for `bind_int`.
    unsafe { ffi::sqlite3_bind_null(s, param) }
}

/// Binds one value.
fn bind_one(s: *mut ffi::sqlite3_stmt, param: c_int, arg: &RawValue) -> c_int {
    match arg {
        RawValue::Null => bind_null(s, param),
        RawValue::Integer(v) => bind_int(s, param, *v),
        // SAFETY: `s` is a prepared statement; `param` is one of its parameters.
        RawValue::Real(v) => unsafe { ffi::sqlite3_bind_double(s, param, *v) },
        RawValue::Text(v) => bind_text(s, param, v),
        RawValue::Blob(v) => {
            // SAFETY: `v` is valid for its length; SQLITE_TRANSIENT makes SQLite copy it.
            unsafe {
                ffi::sqlite3_bind_blob64(
                    s,
                    param,
                    v.as_ptr().cast(),
                    v.len() as u64,
                    ffi::SQLITE_TRANSIENT(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The read connections against a real database file written through sqlx, as the
    //! group-commit writer writes it.
    #![allow(clippy::unwrap_used, reason = "test set-up: a panic is a failed test")]

    use std::path::{Path, PathBuf};
    use std::str::FromStr as _;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};
    use sqlx::{Connection as _, Executor as _};

    use super::*;

    async fn database(dir: &Path) -> (PathBuf, SqliteConnection) {
        let path = dir.join("t.db");
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let mut conn = SqliteConnection::connect_with(&opts).await.unwrap();
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .await
            .unwrap();
        (path, conn)
    }

    fn pool(path: &Path, max: u32) -> Arc<RawReadPool> {
        Arc::new(
            RawReadPool::new(
                path,
                max,
                Duration::from_millis(100),
                Duration::from_millis(200),
                PreparedTexts::default(),
            )
            .unwrap(),
        )
    }

    const COUNT: &str = "SELECT COUNT(*) AS n FROM t WHERE v <> $1";

    /// The SQL texts the reader's connection keeps prepared.
    fn cached_sql(reader: &RawReader) -> Vec<String> {
        reader.slot().cached_sql()
    }

    fn count(reader: &RawReader) -> i64 {
        let out = reader
            .slot()
            .run("test", COUNT, &[RawValue::Text("none".to_owned())], None)
            .unwrap();
        match out.rows[0].get("n").unwrap() {
            RawValue::Integer(n) => *n,
            other => panic!("COUNT(*) gave a {}", other.type_name()),
        }
    }

    #[tokio::test]
    async fn a_reused_read_connection_sees_every_commit_and_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut writer) = database(dir.path()).await;
        let readers = pool(&path, 2);
        writer
            .execute("INSERT INTO t (v) VALUES ('a')")
            .await
            .unwrap();
        let reader = readers.acquire().await.unwrap();
        assert_eq!(count(&reader), 1);
        drop(reader);
        writer
            .execute("INSERT INTO t (v) VALUES ('b')")
            .await
            .unwrap();
        // The same connection, its statement kept prepared: no snapshot of the first read.
        let reader = readers.acquire().await.unwrap();
        assert!(
            cached_sql(&reader).contains(&COUNT.to_owned()),
            "the idle connection was reused with its prepared statement"
        );
        assert_eq!(count(&reader), 2);
        let refused = reader
            .slot()
            .run("test", "INSERT INTO t (v) VALUES ('c')", &[], None)
            .unwrap_err();
        let sqlx::Error::Database(e) = refused else {
            panic!("not a database error: {refused}")
        };
        assert_eq!(
            e.code().as_deref(),
            Some("8"),
            "SQLITE_READONLY expected: {}",
            e.message()
        );
    }

    #[tokio::test]
    async fn at_most_max_connections_are_out_and_an_acquire_waits_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _writer) = database(dir.path()).await;
        let readers = pool(&path, 1);
        let first = readers.acquire().await.unwrap();
        let waited = readers.acquire().await.unwrap_err();
        assert!(matches!(waited, sqlx::Error::PoolTimedOut), "{waited}");
        let pending = tokio::spawn({
            let readers = Arc::clone(&readers);
            async move { readers.acquire().await.map(|r| count(&r)) }
        });
        drop(first);
        assert_eq!(pending.await.unwrap().unwrap(), 0);
    }

    #[tokio::test]
    async fn a_connection_left_inside_a_transaction_is_closed_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _writer) = database(dir.path()).await;
        let readers = pool(&path, 1);
        let reader = readers.acquire().await.unwrap();
        reader.slot().run("test", "BEGIN", &[], None).unwrap();
        assert_eq!(count(&reader), 0);
        drop(reader);
        assert!(readers.idle.lock().unwrap().is_empty());
        let reader = readers.acquire().await.unwrap();
        drop(reader);
        assert_eq!(readers.idle.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn statements_are_bounded_per_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _writer) = database(dir.path()).await;
        let readers = pool(&path, 1);
        let reader = readers.acquire().await.unwrap();
        for i in 0..=MAX_CACHED_SQL {
            reader
                .slot()
                .run("test", &format!("SELECT {i} AS n"), &[], None)
                .unwrap();
        }
        let cached = cached_sql(&reader).len();
        assert!(cached <= MAX_CACHED_SQL, "{cached} SQL texts kept prepared");
        assert_eq!(count(&reader), 0);
    }

    #[tokio::test]
    async fn each_statement_of_a_text_is_explained_and_nothing_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut writer) = database(dir.path()).await;
        writer.execute("CREATE INDEX t_v ON t (v)").await.unwrap();
        let readers = pool(&path, 1);
        let reader = readers.acquire().await.unwrap();
        let plans = reader
            .slot()
            .explain_query_plan(
                "SELECT v FROM t WHERE id = $1;\n SELECT COUNT(*) AS n FROM t \
                 WHERE v IN (SELECT v FROM t WHERE id > $2); -- done",
            )
            .unwrap();
        assert_eq!(
            plans,
            [
                vec!["SEARCH t USING INTEGER PRIMARY KEY (rowid=?)".to_owned()],
                vec![
                    "SEARCH t USING COVERING INDEX t_v (v=?)".to_owned(),
                    "LIST SUBQUERY 1".to_owned(),
                    "  SEARCH t USING INTEGER PRIMARY KEY (rowid>?)".to_owned(),
                ],
            ]
        );
        assert!(cached_sql(&reader).is_empty(), "{:?}", cached_sql(&reader));
        // A diagnostic's own `EXPLAIN QUERY PLAN` text has the plan of what it explains.
        assert_eq!(
            reader
                .slot()
                .explain_query_plan("explain query plan SELECT v FROM t WHERE id = $1")
                .unwrap(),
            [plans[0].clone()]
        );
        let unknown = reader
            .slot()
            .explain_query_plan("SELECT v FROM missing")
            .unwrap_err();
        assert!(unknown.to_string().contains("no such table"), "{unknown}");
    }

    #[tokio::test]
    async fn a_text_is_recorded_once_with_its_first_context_up_to_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _writer) = database(dir.path()).await;
        let recorded = PreparedTexts::default();
        let readers = Arc::new(
            RawReadPool::new(
                &path,
                2,
                Duration::from_millis(100),
                Duration::from_millis(200),
                recorded.clone(),
            )
            .unwrap(),
        );
        // Two connections prepare the same text; a failed preparation records nothing.
        let (first, second) = (
            readers.acquire().await.unwrap(),
            readers.acquire().await.unwrap(),
        );
        let none = [RawValue::Text("none".to_owned())];
        first.slot().run("count", COUNT, &none, None).unwrap();
        second
            .slot()
            .run("count again", COUNT, &none, None)
            .unwrap();
        first.slot().run("count", COUNT, &none, None).unwrap();
        assert!(first.slot().run("bad", "SELECT nope", &[], None).is_err());
        assert_eq!(recorded.snapshot(), (vec![("count", COUNT.to_owned())], 0));

        for i in 0..MAX_RECORDED_SQL {
            recorded.record("many", &format!("SELECT {i}"));
        }
        let (texts, unrecorded) = recorded.snapshot();
        assert_eq!(texts.len(), MAX_RECORDED_SQL);
        assert_eq!(
            unrecorded, 1,
            "the text past the bound is counted, not kept"
        );
        assert!(texts.contains(&("count", COUNT.to_owned())));
    }

    #[tokio::test]
    async fn a_missing_file_is_named_and_a_closed_pool_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let missing = pool(&dir.path().join("missing.db"), 1);
        let error = missing.acquire().await.unwrap_err();
        assert!(error.to_string().contains("unable to open"), "{error}");
        let (path, _writer) = database(dir.path()).await;
        let readers = pool(&path, 1);
        drop(readers.acquire().await.unwrap());
        readers.close();
        assert!(readers.idle.lock().unwrap().is_empty());
        let error = readers.acquire().await.unwrap_err();
        assert!(matches!(error, sqlx::Error::PoolClosed), "{error}");
    }
}
