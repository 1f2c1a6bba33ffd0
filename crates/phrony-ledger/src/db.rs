//! A thin layer that lets one SQL text (with `$1`, `$2`, … placeholders, which both SQLite and
//! PostgreSQL accept) run on either backend. Values are bound with the backend's native type:
//! PostgreSQL gets `uuid`, `timestamptz` and `jsonb`; SQLite gets canonical text.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Postgres, Row as _, Sqlite};
use uuid::Uuid;

use crate::LedgerClock;
use crate::audit_key::AuditKey;
use crate::chain::{canonical_json, format_ts};
use crate::commits::{
    CommittedAppend, CommittedEvent, HANDED_OVER_PAYLOAD_MAX, Listeners, Pending,
};
use crate::error::{LedgerError, Result, SqlxResultExt};
use crate::group::{GroupWriter, Lease};
use crate::model::Event;
use crate::outbox::Outbox;
use crate::replica::Replica;
use crate::sqlite_raw::{RawReadPool, RawReader, RawRow, RawSlot, RawValue};

/// Which database a [`crate::Ledger`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file (or in-memory database).
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

impl Backend {
    /// `"sqlite"` or `"postgres"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Pool {
    /// Writes queue on the group-commit writer (which takes its connection from the sqlx
    /// pool). Reads of a database file use the direct read connections (`sqlite_raw`), reads
    /// of an in-memory database the sqlx pool (its one connection is the only way to it).
    Sqlite(SqlitePool, GroupWriter, Option<Arc<RawReadPool>>),
    Postgres(PgPool),
}

impl Pool {
    pub(crate) fn backend(&self) -> Backend {
        match self {
            Self::Sqlite(..) => Backend::Sqlite,
            Self::Postgres(_) => Backend::Postgres,
        }
    }

    /// Starts a write transaction. On PostgreSQL it is a transaction of its own; on SQLite a
    /// savepoint in the group-commit writer's batch (`BEGIN IMMEDIATE` when the batch starts,
    /// so the database write lock is taken up front, waiting up to the busy timeout), whose
    /// commit returns once the whole batch committed (see the `group` module).
    pub(crate) async fn begin_write(
        &self,
        clock: &LedgerClock,
        audit_key: Option<Arc<AuditKey>>,
        outbox: Option<Arc<Outbox>>,
        replica: Option<Arc<Replica>>,
    ) -> Result<Tx> {
        self.begin(clock, audit_key, outbox, replica, false).await
    }

    /// A write transaction that runs below SQLite's free-space reserve: the start-up audit
    /// check, which seals a few rows at most (without it a daemon restarted below the reserve
    /// could not start and report its outage).
    pub(crate) async fn begin_exempt(
        &self,
        clock: &LedgerClock,
        audit_key: Option<Arc<AuditKey>>,
        outbox: Option<Arc<Outbox>>,
    ) -> Result<Tx> {
        let kind = match self {
            Self::Sqlite(_, writer, _) => TxKind::Sqlite(writer.begin_exempt().await?),
            Self::Postgres(_) => return self.begin(clock, audit_key, outbox, None, false).await,
        };
        Ok(Tx::new(kind, clock, audit_key, outbox, None))
    }

    /// [`Pool::begin_write`] for a write that changes connection state later writes of a
    /// batch would inherit (e.g. `PRAGMA defer_foreign_keys`): on SQLite it is a batch of its own.
    pub(crate) async fn begin_write_alone(
        &self,
        clock: &LedgerClock,
        audit_key: Option<Arc<AuditKey>>,
        outbox: Option<Arc<Outbox>>,
        replica: Option<Arc<Replica>>,
    ) -> Result<Tx> {
        self.begin(clock, audit_key, outbox, replica, true).await
    }

    async fn begin(
        &self,
        clock: &LedgerClock,
        audit_key: Option<Arc<AuditKey>>,
        outbox: Option<Arc<Outbox>>,
        replica: Option<Arc<Replica>>,
        alone: bool,
    ) -> Result<Tx> {
        let kind = match self {
            // The writer records its wait and hold times (`group.rs`).
            Self::Sqlite(_, writer, _) => TxKind::Sqlite(writer.begin(alone).await?),
            Self::Postgres(p) => {
                let asked = std::time::Instant::now();
                let tx = p.begin().await.ctx("begin transaction")?;
                let begun = std::time::Instant::now();
                phrony_metrics::LEDGER_WRITE_WAIT.observe(begun - asked);
                TxKind::Postgres(tx, begun)
            }
        };
        Ok(Tx::new(kind, clock, audit_key, outbox, replica))
    }

    pub(crate) async fn acquire(&self) -> Result<PooledConn> {
        match self {
            Self::Sqlite(_, _, Some(readers)) => Ok(PooledConn::SqliteRaw(
                readers.acquire().await.ctx("acquire connection")?,
            )),
            Self::Sqlite(p, _, None) => Ok(PooledConn::Sqlite(
                p.acquire().await.ctx("acquire connection")?,
            )),
            Self::Postgres(p) => Ok(PooledConn::Postgres(
                p.acquire().await.ctx("acquire connection")?,
            )),
        }
    }

    /// A read-only view of one committed state of the database, for a check that reads it in
    /// several statements (the audit: a stream's head, then its events; the stream set, then
    /// the streams): on SQLite a deferred transaction (in WAL mode its snapshot is taken at its
    /// first read and held to its end), on PostgreSQL `REPEATABLE READ READ ONLY`. It takes no
    /// lock: writers go on. End it with [`Snapshot::end`]; dropped without, a SQLite read
    /// connection is closed (not reused inside a transaction) and the others roll back.
    ///
    /// With [`TempTables::Written`] it may create and write temporary tables: a SQLite read
    /// connection can (its `temp` schema is its own), a PostgreSQL `READ ONLY` transaction
    /// cannot, so there it is `REPEATABLE READ` alone, and the caller makes it read-only with
    /// `SET TRANSACTION READ ONLY` once its temporary tables exist.
    async fn snapshot(&self, temp: TempTables) -> Result<Snapshot> {
        match self {
            Self::Sqlite(_, _, Some(readers)) => {
                let reader = readers.acquire().await.ctx("acquire connection")?;
                Conn::SqliteRaw(reader.slot())
                    .execute("begin a read snapshot", "BEGIN", vec![])
                    .await?;
                Ok(Snapshot::SqliteRaw(reader))
            }
            Self::Sqlite(p, _, None) => Ok(Snapshot::Sqlite(
                p.begin().await.ctx("begin a read snapshot")?,
            )),
            Self::Postgres(p) => {
                let mut tx = p
                    .begin_with(match temp {
                        TempTables::None => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                        TempTables::Written => "BEGIN ISOLATION LEVEL REPEATABLE READ",
                    })
                    .await
                    .ctx("begin a read snapshot")?;
                if temp == TempTables::Written {
                    // Temporary tables that shadow real ones are only seen by statements
                    // prepared after them: PostgreSQL does not re-resolve a prepared
                    // statement's unqualified table when a table of that name appears earlier
                    // in the search path (as `pg_temp` is), unless its session's temporary
                    // schema is new. Today every temporary table of a ledger connection is
                    // rolled back with its schema; this keeps it true if one ever is not.
                    sqlx::Connection::clear_cached_statements(&mut *tx)
                        .await
                        .ctx("clear prepared statements")?;
                }
                Ok(Snapshot::Postgres(tx))
            }
        }
    }

    /// Runs `read` on a [`Pool::snapshot`], then ends the snapshot (whatever `read` returned).
    pub(crate) async fn in_snapshot<T>(
        &self,
        temp: TempTables,
        read: impl AsyncFnOnce(&mut Conn<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut snapshot = self.snapshot(temp).await?;
        let result = read(&mut snapshot.conn()).await;
        snapshot.end().await?;
        result
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Sqlite(p, writer, readers) => {
                if let Some(readers) = readers {
                    readers.close();
                }
                // The pool's close waits for every connection, the writer's held one too.
                writer.close().await;
                p.close().await;
            }
            Self::Postgres(p) => p.close().await,
        }
    }
}

/// The upsert clause of a head's seal (`chain_heads`): one text for the seal on its own
/// ([`seal_head`]) and the seal inside PostgreSQL's head update (`advance_head_sql`).
macro_rules! reseal {
    () => {
        "ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, \
         mac = excluded.mac"
    };
}

/// Writes the sealed head of `stream` (in the transaction of the appends it seals).
pub(crate) async fn seal_head(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    stream: &str,
    seq: i64,
    hash: &str,
) -> Result<()> {
    conn.execute(
        "seal stream head",
        concat!(
            "INSERT INTO chain_heads (stream, seq, hash, mac) VALUES ($1, $2, $3, $4) ",
            reseal!()
        ),
        args![stream, seq, hash, key.mac(stream, seq, hash)],
    )
    .await?;
    Ok(())
}

/// The columns of an `events` row, in the order appends bind them.
pub(crate) const EVENT_COLUMNS: &str = "stream, seq, type, ts, actor, call_id, turn, payload, prev_hash, hash, \
     actor_verification, actor_via";

/// The number of [`EVENT_COLUMNS`].
pub(crate) const EVENT_ROW_COLUMNS: usize = 12;

/// Rows per multi-row `INSERT` of events. 256 rows bind 3,072 parameters: under SQLite's limit
/// (32,766 since 3.32; the bundled library is newer) and PostgreSQL's (65,535).
pub(crate) const BATCH_INSERT_ROWS: usize = 256;

/// `rows` parenthesised rows of `columns` parameters each for a `VALUES` list, numbered from
/// `$first`: `($1, $2), ($3, $4)`.
fn values_placeholders(rows: usize, columns: usize, first: usize) -> String {
    let mut sql = String::with_capacity(rows * columns * 6);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for column in 0..columns {
            if column > 0 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(&(first + row * columns + column).to_string());
        }
        sql.push(')');
    }
    sql
}

/// The `UPDATE` that advances a stream head from `$5` to `$2`/`$3` at `$4`; `fenced` adds the
/// lease check (`$6` owner, `$7` epoch): the head moves only while the replica's lease of the
/// session of that id is still the one stored (see `leases.rs`).
fn head_update_sql(fenced: bool) -> &'static str {
    if fenced {
        "UPDATE streams SET last_seq = $2, last_hash = $3, updated_at = $4 \
         WHERE stream = $1 AND last_seq = $5 \
         AND EXISTS (SELECT 1 FROM session_leases \
         WHERE session_id = $1 AND (owner = $6 OR owner IS NULL) AND epoch = $7)"
    } else {
        "UPDATE streams SET last_seq = $2, last_hash = $3, updated_at = $4 \
         WHERE stream = $1 AND last_seq = $5"
    }
}

/// Why a [`head_update_sql`] advanced nothing: the replica's lease of the session is gone
/// ([`LedgerError::Fenced`], with `fence` the replica's id and the epoch it held) or the head
/// moved under the write (a concurrent append: [`LedgerError::Conflict`]).
async fn refused_advance(
    conn: &mut Conn<'_>,
    stream: &str,
    fence: Option<(String, i64)>,
) -> LedgerError {
    // (The fence refuses only once the epoch moved on — another acquisition. A lease this
    // replica released at that epoch, and nobody took since, refuses nothing: its driver has
    // stopped, and an operator's cancel landing between the release and the replica forgetting
    // the lease is no stale driver write.) Only the fence's refusal is `Fenced`: a driver
    // treats it as "driven elsewhere" and stops for good.
    let lost = match &fence {
        Some((owner, epoch)) => match conn
            .fetch_optional(
                "check the session lease of a refused append",
                "SELECT 1 AS held FROM session_leases \
                 WHERE session_id = $1 AND (owner = $2 OR owner IS NULL) AND epoch = $3",
                args![stream, owner, *epoch],
            )
            .await
        {
            Ok(held) => held.is_none(),
            Err(error) => return error,
        },
        None => false,
    };
    if let Some((_, epoch)) = fence.filter(|_| lost) {
        phrony_metrics::LEDGER_FENCED_WRITES.inc();
        tracing::warn!(
            session_id = %stream,
            epoch,
            "a write to a session this replica no longer leases was refused"
        );
        return LedgerError::Fenced {
            session_id: stream.to_owned(),
            epoch: u64::try_from(epoch).unwrap_or_default(),
        };
    }
    LedgerError::Conflict {
        message: format!("stream {stream} advanced concurrently"),
    }
}

/// The `UPDATE` that advances a stream head ([`head_update_sql`]) as PostgreSQL runs it: a
/// `WITH` whose main statement writes only if the head advanced: with `sealed`, an `INSERT`
/// sealing the head (the MAC the parameter after the fence's, or `$6`); with `events`, an
/// `INSERT` of the write's rows (`VALUES` numbered from the parameter after those).
fn advance_head_sql(fenced: bool, sealed: bool, events: Option<&str>) -> String {
    let update = head_update_sql(fenced);
    let mac = if fenced { "$8" } else { "$6" };
    let seal = format!(
        "INSERT INTO chain_heads (stream, seq, hash, mac) \
         SELECT stream, last_seq, last_hash, {mac} FROM advanced {}",
        reseal!()
    );
    match (sealed, events) {
        (true, None) => {
            format!("WITH advanced AS ({update} RETURNING stream, last_seq, last_hash) {seal}")
        }
        (true, Some(values)) => format!(
            "WITH advanced AS ({update} RETURNING stream, last_seq, last_hash), \
             sealed AS ({seal}) \
             INSERT INTO events ({EVENT_COLUMNS}) \
             SELECT v.* FROM advanced, (VALUES {values}) AS v ({EVENT_COLUMNS})"
        ),
        (false, Some(values)) => format!(
            "WITH advanced AS ({update} RETURNING stream) \
             INSERT INTO events ({EVENT_COLUMNS}) \
             SELECT v.* FROM advanced, (VALUES {values}) AS v ({EVENT_COLUMNS})"
        ),
        (false, None) => update.to_owned(),
    }
}

/// Inserts event rows (`binds`, [`EVENT_ROW_COLUMNS`] per row) in multi-row `INSERT`s of up
/// to [`BATCH_INSERT_ROWS`] rows.
async fn insert_events(conn: &mut Conn<'_>, mut binds: Vec<Arg>) -> Result<()> {
    while !binds.is_empty() {
        let rest = binds.split_off(binds.len().min(BATCH_INSERT_ROWS * EVENT_ROW_COLUMNS));
        let chunk = std::mem::replace(&mut binds, rest);
        let sql = format!(
            "INSERT INTO events ({EVENT_COLUMNS}) VALUES {}",
            values_placeholders(chunk.len() / EVENT_ROW_COLUMNS, EVENT_ROW_COLUMNS, 1)
        );
        conn.execute("append events", &sql, chunk).await?;
    }
    Ok(())
}

/// Advances `head` from its stored seq (fenced by its lease: see `leases.rs`), in one statement
/// on PostgreSQL with `seal` (the head's MAC) and `rows` (at most [`BATCH_INSERT_ROWS`] event
/// rows' binds), both written only if the head advanced. Otherwise [`refused_advance`]'s error.
async fn advance_head(
    conn: &mut Conn<'_>,
    head: &PendingHead,
    seal: Option<String>,
    rows: Option<Vec<Arg>>,
) -> Result<()> {
    let mut binds = args![&head.stream, head.seq, &head.hash, head.ts, head.stored_seq];
    let context = match (&head.fence, rows.is_some()) {
        (None, false) => "advance stream head",
        (None, true) => "append events and advance stream head",
        (Some((owner, epoch)), with_events) => {
            binds.extend(args![owner, *epoch]);
            if with_events {
                "append events and advance fenced stream head"
            } else {
                "advance fenced stream head"
            }
        }
    };
    let sealed = seal.is_some();
    if let Some(mac) = seal {
        binds.extend(args![mac]);
    }
    let (updated, expected) = match rows {
        None => {
            // The four texts without events, built once.
            static SQL: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
                [
                    advance_head_sql(false, false, None),
                    advance_head_sql(true, false, None),
                    advance_head_sql(false, true, None),
                    advance_head_sql(true, true, None),
                ]
            });
            let sql = &SQL[usize::from(head.fence.is_some()) + 2 * usize::from(sealed)];
            (conn.execute(context, sql, binds).await?, 1)
        }
        Some(rows) => {
            let n = rows.len() / EVENT_ROW_COLUMNS;
            let values = values_placeholders(n, EVENT_ROW_COLUMNS, binds.len() + 1);
            binds.extend(rows);
            let sql = advance_head_sql(head.fence.is_some(), sealed, Some(&values));
            (
                conn.execute(context, &sql, binds).await?,
                u64::try_from(n).unwrap_or(u64::MAX),
            )
        }
    };
    if updated != expected {
        return Err(refused_advance(conn, &head.stream, head.fence.clone()).await);
    }
    Ok(())
}

/// A stream head a write advanced and the events it appended to the stream, written when the
/// write commits ([`Tx::append_on_commit`]).
struct PendingHead {
    stream: String,
    /// The head's seq as stored, before the write's first append to the stream.
    stored_seq: i64,
    seq: i64,
    hash: String,
    ts: DateTime<Utc>,
    /// The replica's lease fence on the stream at the write's first append to it.
    fence: Option<(String, i64)>,
    /// The binds of the write's events on the stream, [`EVENT_ROW_COLUMNS`] per row, in order.
    rows: Vec<Arg>,
}

/// A write transaction, with the clock its writes take their times from.
pub(crate) struct Tx {
    kind: TxKind,
    clock: LedgerClock,
    /// Seals each stream head the transaction appends to (`chain_heads`); `None` without a key.
    audit_key: Option<Arc<AuditKey>>,
    /// The webhook routes appends write outbox rows for; `None` when webhooks are off.
    outbox: Option<Arc<Outbox>>,
    /// Whether this transaction wrote outbox or due delivery rows: its commit wakes the sender.
    outbox_written: bool,
    /// The replica writing, whose session leases fence its appends to those sessions' streams
    /// (`leases.rs`); `None` for writes that are never fenced.
    replica: Option<Arc<Replica>>,
    /// Who hears this transaction's appends once it committed (`commits.rs`); `None`: nobody.
    listeners: Option<Arc<Listeners>>,
    /// The appends the listeners wanted, handed over by [`Tx::commit`].
    committed: Vec<Pending>,
    /// The session leases this transaction releases with their session's end
    /// (`leases::release_with_end`): the replica forgets them once it commits.
    released: Vec<(String, i64)>,
    /// The streams the transaction appended to, each with its events and its head at its last
    /// append, written when it commits ([`Tx::append_on_commit`]).
    heads: Vec<PendingHead>,
}

enum TxKind {
    Sqlite(Lease),
    /// The transaction, and when its `BEGIN` returned.
    Postgres(sqlx::Transaction<'static, Postgres>, std::time::Instant),
}

impl Tx {
    fn new(
        kind: TxKind,
        clock: &LedgerClock,
        audit_key: Option<Arc<AuditKey>>,
        outbox: Option<Arc<Outbox>>,
        replica: Option<Arc<Replica>>,
    ) -> Self {
        Self {
            kind,
            clock: clock.clone(),
            audit_key,
            outbox,
            outbox_written: false,
            replica,
            listeners: None,
            committed: Vec::new(),
            released: Vec::new(),
            heads: Vec::new(),
        }
    }

    /// Appends `rows` (event rows' binds, [`EVENT_ROW_COLUMNS`] per row) to `stream` and
    /// advances its head from `from_seq` to `seq` / `hash` (at `ts`) when this transaction
    /// commits, in it: per stream and transaction one head update and seal however many
    /// appends it made ([`Tx::write_appends`]). [`Tx::pending_head`] is the head the write's
    /// later appends chain on (`events::lock_stream` reads it), and a statement that reads
    /// events or heads inside a write calls [`Tx::write_appends`] first. `Conflict` when
    /// `from_seq` is not the stream's head in this transaction (an append chained on a stale
    /// head).
    pub(crate) fn append_on_commit(
        &mut self,
        stream: &str,
        from_seq: i64,
        seq: i64,
        hash: &str,
        ts: DateTime<Utc>,
        rows: Vec<Arg>,
    ) -> Result<()> {
        if let Some(head) = self.heads.iter_mut().find(|h| h.stream == stream) {
            if head.seq != from_seq {
                return Err(LedgerError::Conflict {
                    message: format!(
                        "stream {stream}: an append chained on seq {from_seq}, but this write \
                         advanced the head to seq {}",
                        head.seq
                    ),
                });
            }
            head.seq = seq;
            hash.clone_into(&mut head.hash);
            head.ts = ts;
            head.rows.extend(rows);
            return Ok(());
        }
        let fence = self.fence(stream);
        self.heads.push(PendingHead {
            stream: stream.to_owned(),
            stored_seq: from_seq,
            seq,
            hash: hash.to_owned(),
            ts,
            fence,
            rows,
        });
        Ok(())
    }

    /// The head this transaction advanced `stream` to and has not written yet, as `(seq,
    /// hash)` ([`Tx::append_on_commit`]).
    pub(crate) fn pending_head(&self, stream: &str) -> Option<(i64, &str)> {
        self.heads
            .iter()
            .find(|h| h.stream == stream)
            .map(|h| (h.seq, h.hash.as_str()))
    }

    /// Writes what the transaction's appends kept for its commit ([`Tx::append_on_commit`]):
    /// per stream, its events and the `UPDATE` of its head from the head stored before this
    /// transaction, fenced by the lease the replica held at the first append
    /// ([`LedgerError::Fenced`] when that lease is gone), and with an audit key its seal. On
    /// PostgreSQL one statement per stream (more only past [`BATCH_INSERT_ROWS`] events); on
    /// SQLite the events of every stream in one multi-row `INSERT`, then per stream its head
    /// update and seal. [`Tx::commit`] calls it; a statement that reads events or heads inside
    /// a write calls it first.
    pub(crate) async fn write_appends(&mut self) -> Result<()> {
        let mut heads = std::mem::take(&mut self.heads);
        if heads.is_empty() {
            return Ok(());
        }
        let key = self.audit_key.clone();
        let backend = self.backend();
        let mut conn = self.conn();
        match backend {
            Backend::Postgres => {
                for head in &mut heads {
                    let seal = key
                        .as_deref()
                        .map(|key| key.mac(&head.stream, head.seq, &head.hash));
                    let rows = std::mem::take(&mut head.rows);
                    if rows.len() <= BATCH_INSERT_ROWS * EVENT_ROW_COLUMNS {
                        advance_head(&mut conn, head, seal, Some(rows)).await?;
                    } else {
                        insert_events(&mut conn, rows).await?;
                        advance_head(&mut conn, head, seal, None).await?;
                    }
                }
            }
            Backend::Sqlite => {
                // SQLite's statements cost no round trip and cannot write in a `WITH`.
                let mut rows = Vec::new();
                for head in &mut heads {
                    rows.append(&mut head.rows);
                }
                insert_events(&mut conn, rows).await?;
                for head in &heads {
                    advance_head(&mut conn, head, None, None).await?;
                    if let Some(key) = &key {
                        seal_head(&mut conn, key, &head.stream, head.seq, &head.hash).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The current time by the ledger's clock (microsecond precision).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The audit key appends seal their stream heads with, if the ledger has one.
    pub(crate) fn audit_key(&self) -> Option<Arc<AuditKey>> {
        self.audit_key.clone()
    }

    /// The webhook routes, when webhooks are on.
    pub(crate) fn outbox(&self) -> Option<Arc<Outbox>> {
        self.outbox.clone()
    }

    /// Hands this transaction's appends, once it committed, to the listeners that want them.
    pub(crate) fn listen(&mut self, listeners: Arc<Listeners>) {
        self.listeners = Some(listeners);
    }

    /// Keeps an append for the listeners that want its stream (none: nothing is kept).
    /// `payloads` are the sizes of the events' canonical JSON payloads, in order.
    pub(crate) fn appended(
        &mut self,
        stream: &str,
        last_seq: u64,
        events: &[Event],
        payloads: impl Iterator<Item = usize>,
    ) {
        let Some(listeners) = &self.listeners else {
            return;
        };
        let listeners = listeners.wanting(stream);
        if listeners.is_empty() {
            return;
        }
        let events = events
            .iter()
            .zip(payloads)
            .filter(|(_, bytes)| *bytes <= HANDED_OVER_PAYLOAD_MAX)
            .map(|(event, payload_bytes)| CommittedEvent {
                event: event.clone(),
                payload_bytes,
            })
            .collect();
        self.committed.push(Pending {
            listeners,
            append: CommittedAppend {
                stream: stream.to_owned(),
                last_seq,
                events,
            },
        });
    }

    /// Notes that this transaction made deliveries due: its commit wakes the sender.
    pub(crate) fn mark_outbox_written(&mut self) {
        self.outbox_written = true;
    }

    /// The replica's fence on `stream`: its id and the epoch of the lease it holds on the
    /// session of that id, when it holds one.
    pub(crate) fn fence(&self, stream: &str) -> Option<(String, i64)> {
        let replica = self.replica.as_ref()?;
        replica
            .fence(stream)
            .map(|epoch| (replica.id().to_owned(), epoch))
    }

    /// Notes that this transaction releases this replica's lease of `session_id` at `epoch`
    /// (marked being released now: a renewal beside it must not take it for lost).
    pub(crate) fn releases_lease(&mut self, session_id: &str, epoch: i64) {
        if let Some(replica) = &self.replica {
            replica.releasing(session_id, epoch);
            self.released.push((session_id.to_owned(), epoch));
        }
    }

    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match &mut self.kind {
            TxKind::Sqlite(lease) => Conn::SqliteRaw(lease.slot()),
            TxKind::Postgres(tx, _) => Conn::Postgres(tx),
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        match self.kind {
            TxKind::Sqlite(_) => Backend::Sqlite,
            TxKind::Postgres(..) => Backend::Postgres,
        }
    }

    /// Commits; on SQLite returns once the write's batch committed (a write is acknowledged
    /// only when it is durable).
    pub(crate) async fn commit(mut self) -> Result<()> {
        if let Err(error) = self.write_appends().await {
            return self.rollback().await.and(Err(error));
        }
        let committed = match self.kind {
            TxKind::Sqlite(lease) => lease.release().await,
            TxKind::Postgres(tx, begun) => {
                let started = std::time::Instant::now();
                let committed = tx.commit().await.ctx("commit transaction");
                if committed.is_ok() {
                    phrony_metrics::LEDGER_COMMIT.observe(started.elapsed());
                }
                phrony_metrics::LEDGER_WRITE_HOLD.observe(begun.elapsed());
                committed
            }
        };
        if let Err(error) = committed {
            keep_held(self.replica.as_ref(), &self.released);
            return Err(error);
        }
        // Only after the commit: the sender must find the rows when it wakes.
        if self.outbox_written
            && let Some(outbox) = &self.outbox
        {
            outbox.wake.notify_one();
        }
        if let Some(replica) = &self.replica {
            for (session_id, epoch) in &self.released {
                replica.ended(session_id, *epoch);
            }
        }
        for append in self.committed {
            append.deliver();
        }
        Ok(())
    }

    /// Rolls back. `Err` only on SQLite, when the write ran after others in its batch and
    /// that batch did not commit: what the caller concluded from the state it read is then not
    /// durable, and it must report the outage instead.
    pub(crate) async fn rollback(self) -> Result<()> {
        keep_held(self.replica.as_ref(), &self.released);
        match self.kind {
            TxKind::Sqlite(lease) => lease.roll_back().await,
            TxKind::Postgres(tx, begun) => {
                let rolled_back = tx.rollback().await;
                phrony_metrics::LEDGER_WRITE_HOLD.observe(begun.elapsed());
                if let Err(error) = rolled_back {
                    // The connection is discarded by the pool when a rollback fails; nothing
                    // was committed, so there is nothing else to undo.
                    tracing::warn!(%error, "ledger transaction rollback failed");
                }
                Ok(())
            }
        }
    }
}

/// A transaction did not commit: the leases it was to release with their sessions' ends
/// (`Tx::releases_lease`) stay held.
fn keep_held(replica: Option<&Arc<Replica>>, released: &[(String, i64)]) {
    if let Some(replica) = replica {
        for (session_id, epoch) in released {
            replica.not_released(session_id, *epoch);
        }
    }
}

pub(crate) enum PooledConn {
    Sqlite(sqlx::pool::PoolConnection<Sqlite>),
    /// A direct read connection (see the `sqlite_raw` module).
    SqliteRaw(RawReader),
    Postgres(sqlx::pool::PoolConnection<Postgres>),
}

impl PooledConn {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Self::Sqlite(c) => Conn::Sqlite(c),
            Self::SqliteRaw(r) => Conn::SqliteRaw(r.slot()),
            Self::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// Whether a [`Pool::snapshot`] writes temporary tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TempTables {
    None,
    Written,
}

/// See [`Pool::snapshot`].
pub(crate) enum Snapshot {
    Sqlite(sqlx::Transaction<'static, Sqlite>),
    SqliteRaw(RawReader),
    Postgres(sqlx::Transaction<'static, Postgres>),
}

impl Snapshot {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Self::Sqlite(tx) => Conn::Sqlite(tx),
            Self::SqliteRaw(r) => Conn::SqliteRaw(r.slot()),
            Self::Postgres(tx) => Conn::Postgres(tx),
        }
    }

    /// Ends the snapshot (it wrote nothing: rolled back).
    pub(crate) async fn end(self) -> Result<()> {
        match self {
            Self::Sqlite(tx) => tx.rollback().await.ctx("end a read snapshot"),
            Self::SqliteRaw(reader) => Conn::SqliteRaw(reader.slot())
                .execute("end a read snapshot", "ROLLBACK", vec![])
                .await
                .map(|_| ()),
            Self::Postgres(tx) => tx.rollback().await.ctx("end a read snapshot"),
        }
    }
}

/// A borrowed connection of either backend (inside or outside a transaction).
pub(crate) enum Conn<'c> {
    Sqlite(&'c mut SqliteConnection),
    /// A connection called directly, no hand-off per statement (the `sqlite_raw` module): the
    /// group-commit writer's, or a read connection.
    SqliteRaw(&'c RawSlot),
    Postgres(&'c mut PgConnection),
}

/// A bind value.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    OptInt(Option<i64>),
    Uuid(Uuid),
    OptUuid(Option<Uuid>),
    Ts(DateTime<Utc>),
    OptTs(Option<DateTime<Utc>>),
    /// A `jsonb` column on PostgreSQL, canonical JSON text on SQLite.
    Json(Value),
    /// A nullable JSON column.
    OptJson(Option<Value>),
    /// `boolean` on PostgreSQL, `INTEGER` 0/1 on SQLite.
    Bool(bool),
    /// A nullable boolean.
    OptBool(Option<bool>),
    /// `bytea` on PostgreSQL, `BLOB` on SQLite.
    Bytes(Vec<u8>),
    /// A `text[]` on PostgreSQL (for `= ANY($n)`); a JSON array of strings on SQLite, which has
    /// no arrays (there a list is spelled `IN ($n, …)` with one parameter per value instead).
    TextList(Vec<String>),
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Self::Text(v.clone())
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Self::OptText(v)
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Self::OptText(v.map(str::to_owned))
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Self::OptInt(v)
    }
}
impl From<Uuid> for Arg {
    fn from(v: Uuid) -> Self {
        Self::Uuid(v)
    }
}
impl From<Option<Uuid>> for Arg {
    fn from(v: Option<Uuid>) -> Self {
        Self::OptUuid(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}
impl From<Option<bool>> for Arg {
    fn from(v: Option<bool>) -> Self {
        Self::OptBool(v)
    }
}
impl From<DateTime<Utc>> for Arg {
    fn from(v: DateTime<Utc>) -> Self {
        Self::Ts(v)
    }
}
impl From<Option<DateTime<Utc>>> for Arg {
    fn from(v: Option<DateTime<Utc>>) -> Self {
        Self::OptTs(v)
    }
}

/// Builds a `Vec<Arg>` from values convertible into [`Arg`].
macro_rules! args {
    ($($value:expr),* $(,)?) => { vec![$($crate::db::Arg::from($value)),*] };
}
pub(crate) use args;

fn bind_sqlite<'q>(
    mut q: Query<'q, Sqlite, SqliteArguments<'q>>,
    args: Vec<Arg>,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    for arg in args {
        q = match arg {
            Arg::Text(v) => q.bind(v),
            Arg::OptText(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
            Arg::OptInt(v) => q.bind(v),
            Arg::Uuid(v) => q.bind(v.hyphenated().to_string()),
            Arg::OptUuid(v) => q.bind(v.map(|v| v.hyphenated().to_string())),
            Arg::Ts(v) => q.bind(format_ts(&v)),
            Arg::OptTs(v) => q.bind(v.as_ref().map(format_ts)),
            Arg::Json(v) => q.bind(canonical_json(&v)),
            Arg::OptJson(v) => q.bind(v.as_ref().map(canonical_json)),
            Arg::Bool(v) => q.bind(v),
            Arg::OptBool(v) => q.bind(v),
            Arg::Bytes(v) => q.bind(v),
            Arg::TextList(v) => q.bind(canonical_json(&Value::from(v))),
        };
    }
    q
}

/// A bind value with the encoding [`bind_sqlite`] gives it, for the writer's direct calls.
fn raw_sqlite(args: Vec<Arg>) -> Vec<RawValue> {
    let text = |v: Option<String>| v.map_or(RawValue::Null, RawValue::Text);
    let int = |v: Option<i64>| v.map_or(RawValue::Null, RawValue::Integer);
    args.into_iter()
        .map(|arg| match arg {
            Arg::Text(v) => RawValue::Text(v),
            Arg::OptText(v) => text(v),
            Arg::Int(v) => RawValue::Integer(v),
            Arg::OptInt(v) => int(v),
            Arg::Uuid(v) => RawValue::Text(v.hyphenated().to_string()),
            Arg::OptUuid(v) => text(v.map(|v| v.hyphenated().to_string())),
            Arg::Ts(v) => RawValue::Text(format_ts(&v)),
            Arg::OptTs(v) => text(v.as_ref().map(format_ts)),
            Arg::Json(v) => RawValue::Text(canonical_json(&v)),
            Arg::OptJson(v) => text(v.as_ref().map(canonical_json)),
            Arg::Bool(v) => RawValue::Integer(i64::from(v)),
            Arg::OptBool(v) => int(v.map(i64::from)),
            Arg::Bytes(v) => RawValue::Blob(v),
            Arg::TextList(v) => RawValue::Text(canonical_json(&Value::from(v))),
        })
        .collect()
}

fn bind_pg<'q>(
    mut q: Query<'q, Postgres, PgArguments>,
    args: Vec<Arg>,
) -> Query<'q, Postgres, PgArguments> {
    for arg in args {
        q = match arg {
            Arg::Text(v) => q.bind(v),
            Arg::OptText(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
            Arg::OptInt(v) => q.bind(v),
            Arg::Uuid(v) => q.bind(v),
            Arg::OptUuid(v) => q.bind(v),
            Arg::Ts(v) => q.bind(v),
            Arg::OptTs(v) => q.bind(v),
            Arg::Json(v) => q.bind(sqlx::types::Json(v)),
            Arg::OptJson(v) => q.bind(v.map(sqlx::types::Json)),
            Arg::Bool(v) => q.bind(v),
            Arg::OptBool(v) => q.bind(v),
            Arg::Bytes(v) => q.bind(v),
            Arg::TextList(v) => q.bind(v),
        };
    }
    q
}

impl Conn<'_> {
    pub(crate) async fn execute(
        &mut self,
        context: &'static str,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<u64> {
        match self {
            Conn::Sqlite(c) => bind_sqlite(sqlx::query(sql), args)
                .execute(&mut **c)
                .await
                .map(|r| r.rows_affected())
                .ctx(context),
            Conn::SqliteRaw(slot) => slot
                .run(context, sql, &raw_sqlite(args), None)
                .map(|o| o.rows_affected)
                .ctx(context),
            Conn::Postgres(c) => bind_pg(sqlx::query(sql), args)
                .execute(&mut **c)
                .await
                .map(|r| r.rows_affected())
                .ctx(context),
        }
    }

    pub(crate) async fn fetch_optional(
        &mut self,
        context: &'static str,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Option<Row>> {
        match self {
            Conn::Sqlite(c) => Ok(bind_sqlite(sqlx::query(sql), args)
                .fetch_optional(&mut **c)
                .await
                .ctx(context)?
                .map(|row| Row::Sqlite(row, context))),
            Conn::SqliteRaw(slot) => Ok(slot
                .run(context, sql, &raw_sqlite(args), Some(1))
                .ctx(context)?
                .rows
                .pop()
                .map(|row| Row::Raw(row, context))),
            Conn::Postgres(c) => Ok(bind_pg(sqlx::query(sql), args)
                .fetch_optional(&mut **c)
                .await
                .ctx(context)?
                .map(|row| Row::Postgres(row, context))),
        }
    }

    pub(crate) async fn fetch_all(
        &mut self,
        context: &'static str,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<Row>> {
        match self {
            Conn::Sqlite(c) => Ok(bind_sqlite(sqlx::query(sql), args)
                .fetch_all(&mut **c)
                .await
                .ctx(context)?
                .into_iter()
                .map(|row| Row::Sqlite(row, context))
                .collect()),
            Conn::SqliteRaw(slot) => Ok(slot
                .run(context, sql, &raw_sqlite(args), None)
                .ctx(context)?
                .rows
                .into_iter()
                .map(|row| Row::Raw(row, context))
                .collect()),
            Conn::Postgres(c) => Ok(bind_pg(sqlx::query(sql), args)
                .fetch_all(&mut **c)
                .await
                .ctx(context)?
                .into_iter()
                .map(|row| Row::Postgres(row, context))
                .collect()),
        }
    }
}

/// A result row of either backend, with typed accessors that hide the storage differences.
pub(crate) enum Row {
    Sqlite(SqliteRow, &'static str),
    /// A row read on the group-commit writer's connection directly.
    Raw(RawRow, &'static str),
    Postgres(PgRow, &'static str),
}

impl Row {
    fn context(&self) -> &'static str {
        match self {
            Row::Sqlite(_, c) | Row::Raw(_, c) | Row::Postgres(_, c) => c,
        }
    }

    fn decode_err(&self, column: &str, error: impl std::fmt::Display) -> LedgerError {
        LedgerError::corrupt(format!("{}: column {column}: {error}", self.context()))
    }

    fn get<T>(&self, column: &str) -> Result<T>
    where
        T: for<'r> sqlx::Decode<'r, Sqlite>
            + sqlx::Type<Sqlite>
            + for<'r> sqlx::Decode<'r, Postgres>
            + sqlx::Type<Postgres>,
    {
        let result = match self {
            Row::Sqlite(row, _) => row.try_get::<T, _>(column),
            Row::Postgres(row, _) => row.try_get::<T, _>(column),
            Row::Raw(..) => {
                return Err(self.decode_err(column, "not decodable from a direct SQLite row"));
            }
        };
        result.map_err(|e| self.decode_err(column, e))
    }

    /// The value of a direct row's column, `None` for SQL `NULL`; `Err` names a missing column
    /// or a value of another type than `expected` (as the driver refuses it).
    fn raw<'r, T>(
        &self,
        row: &'r RawRow,
        column: &str,
        expected: &str,
        pick: impl FnOnce(&'r RawValue) -> Option<T>,
    ) -> Result<Option<T>> {
        let value = row.get(column).map_err(|e| self.decode_err(column, e))?;
        if *value == RawValue::Null {
            return Ok(None);
        }
        pick(value).map(Some).ok_or_else(|| {
            self.decode_err(
                column,
                format!("expected {expected}, found {}", value.type_name()),
            )
        })
    }

    pub(crate) fn text(&self, column: &str) -> Result<String> {
        self.opt_text(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }

    pub(crate) fn opt_text(&self, column: &str) -> Result<Option<String>> {
        match self {
            Row::Raw(row, _) => self.raw(row, column, "TEXT", |v| match v {
                RawValue::Text(t) => Some(t.clone()),
                _ => None,
            }),
            _ => self.get(column),
        }
    }

    /// An integer column; PostgreSQL `integer` (int4) columns are widened.
    pub(crate) fn int(&self, column: &str) -> Result<i64> {
        self.opt_int(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }

    pub(crate) fn opt_int(&self, column: &str) -> Result<Option<i64>> {
        match self {
            Row::Sqlite(..) => self.get(column),
            Row::Raw(row, _) => self.raw(row, column, "INTEGER", |v| match v {
                RawValue::Integer(i) => Some(*i),
                _ => None,
            }),
            Row::Postgres(row, _) => match row.try_get::<Option<i64>, _>(column) {
                Ok(v) => Ok(v),
                Err(wide) => row
                    .try_get::<Option<i32>, _>(column)
                    .map(|v| v.map(i64::from))
                    .map_err(|_| self.decode_err(column, wide)),
            },
        }
    }

    pub(crate) fn bool(&self, column: &str) -> Result<bool> {
        self.opt_bool(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }

    pub(crate) fn opt_bool(&self, column: &str) -> Result<Option<bool>> {
        match self {
            Row::Raw(row, _) => self.raw(row, column, "INTEGER (boolean)", |v| match v {
                RawValue::Integer(i) => Some(*i != 0),
                _ => None,
            }),
            _ => self.get(column),
        }
    }

    pub(crate) fn bytes(&self, column: &str) -> Result<Vec<u8>> {
        match self {
            Row::Raw(row, _) => self
                .raw(row, column, "BLOB", |v| match v {
                    RawValue::Blob(b) => Some(b.clone()),
                    RawValue::Text(t) => Some(t.clone().into_bytes()),
                    _ => None,
                })?
                .ok_or_else(|| self.decode_err(column, "unexpected NULL")),
            _ => self.get(column),
        }
    }

    pub(crate) fn opt_json(&self, column: &str) -> Result<Option<Value>> {
        match self {
            Row::Sqlite(..) | Row::Raw(..) => self
                .opt_text(column)?
                .map(|t| serde_json::from_str(&t).map_err(|e| self.decode_err(column, e)))
                .transpose(),
            Row::Postgres(row, _) => row
                .try_get::<Option<sqlx::types::Json<Value>>, _>(column)
                .map(|j| j.map(|j| j.0))
                .map_err(|e| self.decode_err(column, e)),
        }
    }

    pub(crate) fn uuid(&self, column: &str) -> Result<Uuid> {
        self.opt_uuid(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }

    pub(crate) fn opt_uuid(&self, column: &str) -> Result<Option<Uuid>> {
        match self {
            Row::Sqlite(..) | Row::Raw(..) => self
                .opt_text(column)?
                .map(|t| Uuid::parse_str(&t).map_err(|e| self.decode_err(column, e)))
                .transpose(),
            Row::Postgres(row, _) => row.try_get(column).map_err(|e| self.decode_err(column, e)),
        }
    }

    pub(crate) fn ts(&self, column: &str) -> Result<DateTime<Utc>> {
        self.opt_ts(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }

    pub(crate) fn opt_ts(&self, column: &str) -> Result<Option<DateTime<Utc>>> {
        match self {
            Row::Sqlite(..) | Row::Raw(..) => self
                .opt_text(column)?
                .map(|t| {
                    DateTime::parse_from_rfc3339(&t)
                        .map(|t| t.to_utc())
                        .map_err(|e| self.decode_err(column, format!("{e} in {t:?}")))
                })
                .transpose(),
            Row::Postgres(row, _) => row.try_get(column).map_err(|e| self.decode_err(column, e)),
        }
    }

    pub(crate) fn json(&self, column: &str) -> Result<Value> {
        self.opt_json(column)?
            .ok_or_else(|| self.decode_err(column, "unexpected NULL"))
    }
}

#[cfg(test)]
mod group_tests {
    //! The writer's direct calls on a real SQLite file (the conformance suite runs every
    //! ledger write through them; these cover what no ledger write does on purpose).
    #![allow(clippy::unwrap_used, reason = "test set-up: a panic is a failed test")]

    use std::str::FromStr as _;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    use sqlx::sqlite::SqlitePool;

    use super::{Conn, Row};
    use crate::error::LedgerError;
    use crate::group::GroupWriter;
    use crate::sqlite_raw::PreparedTexts;

    async fn writer(dir: &tempfile::TempDir) -> (SqlitePool, GroupWriter) {
        writer_recording(dir, PreparedTexts::default()).await
    }

    /// A writer on a fresh file whose batches record their texts in `recorded`.
    async fn writer_recording(
        dir: &tempfile::TempDir,
        recorded: PreparedTexts,
    ) -> (SqlitePool, GroupWriter) {
        let url = format!("sqlite://{}", dir.path().join("w.db").display());
        let opts = SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, n INTEGER \
             CHECK (n > 0), flag BOOLEAN, data BLOB)",
        )
        .execute(&pool)
        .await
        .unwrap();
        (
            pool.clone(),
            GroupWriter::spawn(pool, true, recorded, None, None),
        )
    }

    async fn count(pool: &SqlitePool) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(pool)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn direct_statements_bind_and_read_every_type_and_classify_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let lease = writer.begin(false).await.unwrap();
        let mut conn = Conn::SqliteRaw(lease.slot());
        let inserted = conn
            .execute(
                "insert",
                "INSERT INTO t (name, n, flag, data) VALUES ($1, $2, $3, $4), ($5, NULL, NULL, NULL)",
                args![
                    "a",
                    7_i64,
                    true,
                    crate::db::Arg::Bytes(vec![0, 1, 255]),
                    "b"
                ],
            )
            .await
            .unwrap();
        assert_eq!(inserted, 2);
        let row: Row = conn
            .fetch_optional(
                "read",
                "SELECT name, n, flag, data FROM t WHERE name = $1",
                args!["a"],
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.text("name").unwrap(), "a");
        assert_eq!(row.int("n").unwrap(), 7);
        assert!(row.bool("flag").unwrap());
        assert_eq!(row.bytes("data").unwrap(), vec![0, 1, 255]);
        let error = row.int("name").unwrap_err();
        assert!(
            error.to_string().contains("expected INTEGER, found TEXT"),
            "{error}"
        );
        let error = row.text("missing").unwrap_err();
        assert!(error.to_string().contains("no column named"), "{error}");
        let all = conn
            .fetch_all("read", "SELECT n FROM t ORDER BY name", args![])
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].opt_int("n").unwrap(), None);
        assert!(all[1].int("n").unwrap_err().to_string().contains("NULL"));

        // A duplicate is a lost race (retried); a CHECK failure is a database error; both
        // leave the connection usable.
        let duplicate = conn
            .execute("dup", "INSERT INTO t (name) VALUES ($1)", args!["a"])
            .await
            .unwrap_err();
        assert!(
            matches!(duplicate, LedgerError::Conflict { .. }),
            "{duplicate:?}"
        );
        let check = conn
            .execute(
                "check",
                "INSERT INTO t (name, n) VALUES ($1, 0)",
                args!["c"],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(check, LedgerError::Database { .. }) && !check.is_unavailable(),
            "{check:?}"
        );
        let missing = conn
            .execute("bind", "INSERT INTO t (name) VALUES ($2)", args!["d"])
            .await
            .unwrap_err();
        assert!(missing.to_string().contains("parameter 2"), "{missing}");
        lease.release().await.unwrap();
        assert_eq!(count(&pool).await, 2);
    }

    #[tokio::test]
    async fn the_writer_records_each_text_once_however_many_batches_prepare_it() {
        let dir = tempfile::tempdir().unwrap();
        let recorded = PreparedTexts::default();
        let (pool, writer) = writer_recording(&dir, recorded.clone()).await;
        for name in ["a", "b"] {
            let lease = writer.begin(false).await.unwrap();
            Conn::SqliteRaw(lease.slot())
                .execute("insert", "INSERT INTO t (name) VALUES ($1)", args![name])
                .await
                .unwrap();
            lease.release().await.unwrap();
        }
        assert_eq!(count(&pool).await, 2);
        assert_eq!(writer.stats().commits, 2, "one batch each");
        let (texts, unrecorded) = recorded.snapshot();
        assert_eq!(unrecorded, 0);
        assert_eq!(
            texts,
            [
                ("begin savepoint", "SAVEPOINT phrony_write".to_owned()),
                ("begin transaction", "BEGIN IMMEDIATE".to_owned()),
                ("commit transaction", "COMMIT".to_owned()),
                ("insert", "INSERT INTO t (name) VALUES ($1)".to_owned()),
                ("release savepoint", "RELEASE phrony_write".to_owned()),
            ]
        );
    }

    /// The writer keeps its connection from batch to batch: the statements an earlier batch
    /// prepared are still prepared when the next one starts (no parse per batch), and a slot of
    /// the earlier batch still finds nothing.
    #[tokio::test]
    async fn the_writer_keeps_its_statements_from_batch_to_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let insert = "INSERT INTO t (name) VALUES ($1)";
        let lease = writer.begin(false).await.unwrap();
        let first = lease.slot().clone();
        Conn::SqliteRaw(lease.slot())
            .execute("insert", insert, args!["a"])
            .await
            .unwrap();
        lease.release().await.unwrap();
        let lease = writer.begin(false).await.unwrap();
        let kept = lease.slot().cached_sql();
        assert!(kept.contains(&insert.to_owned()), "{kept:?}");
        assert!(
            first.cached_sql().is_empty(),
            "the first batch's slot is empty"
        );
        Conn::SqliteRaw(lease.slot())
            .execute("insert", insert, args!["b"])
            .await
            .unwrap();
        lease.release().await.unwrap();
        assert_eq!(count(&pool).await, 2);
        assert_eq!(writer.stats().commits, 2, "one batch each");
    }

    /// The writer's metrics tell a saturated writer apart: a write queued behind one that
    /// holds the writer records that as its wait, the holder its hold, the batch both. (The
    /// metrics are the process's, shared with concurrent tests: deltas are lower bounds.)
    #[tokio::test]
    async fn the_writer_records_each_writes_wait_and_hold_and_its_batches() {
        use phrony_metrics::{LEDGER_BATCH, LEDGER_WRITE_HOLD, LEDGER_WRITE_WAIT};
        const HELD: std::time::Duration = std::time::Duration::from_millis(40);
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let (wait, hold, batch) = (
            LEDGER_WRITE_WAIT.snapshot(),
            LEDGER_WRITE_HOLD.snapshot(),
            LEDGER_BATCH.snapshot(),
        );
        let first = writer.begin(false).await.unwrap();
        let queued = tokio::spawn({
            let writer = writer.clone();
            async move {
                let lease = writer.begin(false).await.unwrap();
                Conn::SqliteRaw(lease.slot())
                    .execute("insert", "INSERT INTO t (name) VALUES ('b')", args![])
                    .await
                    .unwrap();
                lease.release().await.unwrap();
            }
        });
        Conn::SqliteRaw(first.slot())
            .execute("insert", "INSERT INTO t (name) VALUES ('a')", args![])
            .await
            .unwrap();
        tokio::time::sleep(HELD).await;
        first.release().await.unwrap();
        queued.await.unwrap();
        assert_eq!(count(&pool).await, 2);
        let held = HELD.as_secs_f64();
        let (wait, hold, batch) = (
            (LEDGER_WRITE_WAIT.snapshot(), wait),
            (LEDGER_WRITE_HOLD.snapshot(), hold),
            (LEDGER_BATCH.snapshot(), batch),
        );
        // The queued write asked for its turn just after the holder started to sleep.
        for (name, (now, before), writes, at_least) in [
            ("wait", wait, 2, held / 2.0),
            ("hold", hold, 2, held),
            ("batch", batch, 1, held),
        ] {
            assert!(
                now.count >= before.count + writes,
                "{name}: {before:?} -> {now:?}"
            );
            assert!(
                now.sum_seconds - before.sum_seconds >= at_least,
                "{name}: the held {HELD:?} is missing: {before:?} -> {now:?}"
            );
        }
    }

    /// Closing gives the held connection back, so the pool's close (which waits for every
    /// connection) returns; a write after it fails instead of waiting.
    #[tokio::test]
    async fn closing_the_writer_lets_the_pool_close() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let lease = writer.begin(false).await.unwrap();
        Conn::SqliteRaw(lease.slot())
            .execute("insert", "INSERT INTO t (name) VALUES ('a')", args![])
            .await
            .unwrap();
        lease.release().await.unwrap();
        writer.close().await;
        tokio::time::timeout(std::time::Duration::from_secs(10), pool.close())
            .await
            .expect("the pool closed: the writer gave its connection back");
        let error = writer.begin(false).await.unwrap_err();
        assert!(error.is_unavailable(), "{error:?}");
    }

    #[tokio::test]
    async fn a_slot_kept_past_its_batch_finds_no_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let lease = writer.begin(false).await.unwrap();
        let kept = lease.slot().clone();
        kept.run("test", "INSERT INTO t (name) VALUES ('x')", &[], None)
            .unwrap();
        lease.release().await.unwrap();
        let error = kept.run("test", "SELECT 1", &[], None).unwrap_err();
        assert!(error.to_string().contains("batch is over"), "{error}");
        assert_eq!(count(&pool).await, 1);
    }

    #[tokio::test]
    async fn a_write_that_ends_the_batch_transaction_fails_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let lease = writer.begin(false).await.unwrap();
        // Ends the batch's transaction and leaves a savepoint of the same name, which outside
        // a transaction is a transaction of its own that its `RELEASE` commits.
        lease.slot().run("test", "ROLLBACK", &[], None).unwrap();
        lease
            .slot()
            .run("test", "SAVEPOINT phrony_write", &[], None)
            .unwrap();
        let error = lease.release().await.unwrap_err();
        assert!(error.is_unavailable(), "{error:?}");

        let lease = writer.begin(false).await.unwrap();
        lease
            .slot()
            .run("test", "INSERT INTO t (name) VALUES ('after')", &[], None)
            .unwrap();
        lease.release().await.unwrap();
        assert_eq!(count(&pool).await, 1);
        assert_eq!(writer.stats().commits, 1);
    }

    /// Writes queued behind a holder run in its batch: one commit for all, both hand-offs of
    /// every write timed, and a write whose caller gave up while it was queued skipped without
    /// ending the batch.
    #[tokio::test]
    async fn queued_writes_share_one_commit_skipping_an_abandoned_one() {
        use phrony_metrics::LEDGER_WRITE_HANDOFF;
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let handoffs = LEDGER_WRITE_HANDOFF.snapshot();
        let first = writer.begin(false).await.unwrap();
        let insert = |name: &'static str| {
            let writer = writer.clone();
            async move {
                let lease = writer.begin(false).await.unwrap();
                let sql = format!("INSERT INTO t (name) VALUES ('{name}')");
                lease.slot().run("test", &sql, &[], None).unwrap();
                lease.release().await.unwrap();
            }
        };
        let before = tokio::spawn(insert("before"));
        let abandoned = tokio::spawn(insert("abandoned"));
        let after = tokio::spawn(insert("after"));
        // All three queue behind the holder (this test's runtime has one thread: they run when
        // it yields, well within the batch's age limit); the second gives up waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        first
            .slot()
            .run("test", "INSERT INTO t (name) VALUES ('first')", &[], None)
            .unwrap();
        first.release().await.unwrap();
        before.await.unwrap();
        after.await.unwrap();
        let mut names: Vec<String> = sqlx::query_scalar("SELECT name FROM t")
            .fetch_all(&pool)
            .await
            .unwrap();
        names.sort();
        assert_eq!(names, ["after", "before", "first"]);
        let stats = writer.stats();
        assert_eq!((stats.commits, stats.writes), (1, 3), "{stats:?}");
        assert!(LEDGER_WRITE_HANDOFF.snapshot().count >= handoffs.count + 6);
    }

    #[tokio::test]
    async fn a_cancelled_write_rolls_back_only_its_own_savepoint() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, writer) = writer(&dir).await;
        let first = writer.begin(false).await.unwrap();
        first
            .slot()
            .run("test", "INSERT INTO t (name) VALUES ('kept')", &[], None)
            .unwrap();
        let (second, done) = tokio::join!(
            async {
                let second = writer.begin(false).await.unwrap();
                second
                    .slot()
                    .run("test", "INSERT INTO t (name) VALUES ('dropped')", &[], None)
                    .unwrap();
                drop(second);
            },
            first.release()
        );
        let () = second;
        done.unwrap();
        // The dropped write's savepoint was undone; the batch (or the next) committed the first.
        let lease = writer.begin(false).await.unwrap();
        lease.release().await.unwrap();
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM t")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(names, ["kept"]);
    }
}
