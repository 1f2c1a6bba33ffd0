//! The ledger's single error type.

use std::borrow::Cow;

/// Every failure the ledger reports.
///
/// The first four variants carry a user-facing message (the wording of the reference's error
/// catalogue where it defines one) and map one-to-one onto gRPC status codes in the gRPC crate:
/// `NotFound`, `FailedPrecondition`, `AlreadyExists`, `InvalidArgument`.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The named agent, version, session or event stream does not exist.
    #[error("{message}")]
    NotFound {
        /// What was not found, e.g. `agent demo/x not found`.
        message: String,
    },
    /// The request is well formed but the current state forbids it (archived, retired, …).
    #[error("{message}")]
    FailedPrecondition {
        /// Why the operation is refused.
        message: String,
    },
    /// The caller is identified but this action is not theirs to take: a vote on an approval
    /// held in a session the voter started (separation of duties), on an approval routed
    /// outside the voter's credential, or an unverified vote where a verified one is needed.
    #[error("{message}")]
    PermissionDenied {
        /// Who was refused what, and why.
        message: String,
    },
    /// The operation would change something immutable (a published version).
    #[error("{message}")]
    AlreadyExists {
        /// What already exists and why it cannot change.
        message: String,
    },
    /// The caller passed an empty, malformed or out-of-range value.
    #[error("{message}")]
    InvalidArgument {
        /// Which value is wrong and how.
        message: String,
    },
    /// A concurrent writer won a race and the ledger gave up after retrying. Safe to retry.
    #[error("{message}")]
    Conflict {
        /// What was contended.
        message: String,
    },
    /// A configured bound is reached (the live sessions of an agent); nothing was written.
    #[error("{message}")]
    ResourceExhausted {
        /// Which bound, the count, the bound's value and the variable that sets it.
        message: String,
    },
    /// A driver write to a session whose lease this replica no longer holds: another replica
    /// took the session over at a higher epoch (this one was paused, partitioned or too slow
    /// to renew). Nothing of the write was recorded. The driver must stop at once and never
    /// retry: the session is driven elsewhere.
    #[error(
        "session {session_id}: this replica's lease (epoch {epoch}) was taken over by another replica; the write was refused"
    )]
    Fenced {
        /// The session.
        session_id: String,
        /// The epoch of the lease this replica held.
        epoch: u64,
    },
    /// The database URL or ledger options are unusable.
    #[error("{message}")]
    Config {
        /// What is wrong with the configuration and how to fix it.
        message: String,
    },
    /// The database cannot be reached (connect failure, pool timeout, I/O error).
    ///
    /// The driver error is part of the message and not also a
    /// [`std::error::Error::source`] (here and in [`LedgerError::Database`]), so that a report
    /// printing the chain names it once.
    #[error("{context}: {error}")]
    Unavailable {
        /// What the ledger was doing, including the (password-free) database address.
        context: String,
        /// The driver error.
        error: sqlx::Error,
    },
    /// Any other database error.
    #[error("{context}: {error}")]
    Database {
        /// What the ledger was doing.
        context: Cow<'static, str>,
        /// The driver error.
        error: sqlx::Error,
    },
    /// Applying the embedded schema migrations failed.
    #[error("{message}")]
    Migration {
        /// What failed, e.g. that the database was migrated by a newer build.
        message: String,
        /// The migrator's error.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// A stored event of a session or agent stream that the event schema
    /// ([`crate::EventBody`]) cannot read: an unknown type, or a payload of the wrong shape.
    #[error(
        "ledger data is corrupt: stream {stream} seq {seq}: event type {event_type}: {problem}"
    )]
    BadEvent {
        /// The stream.
        stream: String,
        /// The event's seq.
        seq: u64,
        /// Its stored type.
        event_type: String,
        /// What is wrong (`unknown event type`, or the payload's decoding error naming the field).
        problem: String,
    },
    /// Stored data is not what the ledger wrote (a broken hash chain, an unreadable row).
    #[error("ledger data is corrupt: {message}")]
    Corrupt {
        /// What is wrong and where (stream, seq, table, column).
        message: String,
    },
}

impl LedgerError {
    /// Whether retrying the same call may succeed (a lost race or a transient lock timeout).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound {
            message: message.into(),
        }
    }

    pub(crate) fn precondition(message: impl Into<String>) -> Self {
        Self::FailedPrecondition {
            message: message.into(),
        }
    }

    pub(crate) fn denied(message: impl Into<String>) -> Self {
        Self::PermissionDenied {
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            message: message.into(),
        }
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::Corrupt {
            message: message.into(),
        }
    }

    /// Whether the database could not take the write (or read) for a reason that passes by
    /// itself: it is locked by another process past the busy timeout, its disk is full, it is
    /// restarting or unreachable. The daemon reports `NOT_SERVING`, suspends the sessions that
    /// hit it and resumes them when a write succeeds again.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Classifies a driver error: lost races become [`LedgerError::Conflict`], storage outages
    /// ([`is_outage`]) [`LedgerError::Unavailable`], everything else [`LedgerError::Database`].
    pub(crate) fn from_sqlx(context: impl Into<Cow<'static, str>>, source: sqlx::Error) -> Self {
        let context = context.into();
        if is_contention(&source) {
            return Self::Conflict {
                message: format!("{context}: concurrent update ({source})"),
            };
        }
        if is_outage(&source) {
            return Self::Unavailable {
                context: context.into_owned(),
                error: source,
            };
        }
        Self::Database {
            context,
            error: source,
        }
    }
}

/// SQLite primary result codes that mean the storage, not the statement, is the problem.
mod sqlite_code {
    /// `SQLITE_READONLY`: the file (or its directory, or the disk) cannot be written.
    pub(super) const READONLY: i64 = 8;
    /// `SQLITE_BUSY`: another connection (another process) holds the lock past the busy
    /// timeout.
    pub(super) const BUSY: i64 = 5;
    /// `SQLITE_LOCKED`: a lock conflict inside the process.
    pub(super) const LOCKED: i64 = 6;
    /// `SQLITE_IOERR` and its extended codes: a read, write or fsync failed.
    pub(super) const IOERR: i64 = 10;
    /// `SQLITE_FULL`: the disk (or a size limit) is full.
    pub(super) const FULL: i64 = 13;
    /// `SQLITE_CANTOPEN`: the file (or its journal) cannot be opened.
    pub(super) const CANTOPEN: i64 = 14;
    /// `SQLITE_BUSY_SNAPSHOT`: a read transaction that tried to write saw a newer snapshot: a
    /// lost race, retried at once, not an outage.
    pub(super) const BUSY_SNAPSHOT: i64 = 517;
    /// `SQLITE_MISUSE`.
    pub(super) const MISUSE: i32 = 21;
    /// `SQLITE_CONSTRAINT_UNIQUE`, `_PRIMARYKEY`, `_FOREIGNKEY`, `_NOTNULL`, `_CHECK`.
    pub(super) const CONSTRAINT_UNIQUE: i32 = 2067;
    pub(super) const CONSTRAINT_PRIMARYKEY: i32 = 1555;
    pub(super) const CONSTRAINT_FOREIGNKEY: i32 = 787;
    pub(super) const CONSTRAINT_NOTNULL: i32 = 1299;
    pub(super) const CONSTRAINT_CHECK: i32 = 275;
}

/// The (extended) result code of a SQLite error; `None` for other backends' errors.
fn sqlite_code(db: &dyn sqlx::error::DatabaseError) -> Option<i64> {
    if let Some(direct) = db.try_downcast_ref::<RawSqliteError>() {
        return Some(i64::from(direct.code));
    }
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    db.code()?.parse::<i64>().ok()
}

/// A SQLite error from the group-commit writer's direct calls (`sqlite_raw`), classified like
/// the driver's own by its extended result code.
#[derive(Debug)]
pub(crate) struct RawSqliteError {
    /// The extended result code.
    pub(crate) code: i32,
    message: String,
}

impl RawSqliteError {
    pub(crate) fn new(code: i32, message: String) -> Self {
        Self { code, message }
    }

    /// A misuse found before SQLite was called (a parameter without an argument, …).
    pub(crate) fn misuse(message: impl Into<String>) -> Self {
        Self {
            code: sqlite_code::MISUSE,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RawSqliteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for RawSqliteError {}

impl sqlx::error::DatabaseError for RawSqliteError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            sqlite_code::CONSTRAINT_UNIQUE | sqlite_code::CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            sqlite_code::CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            sqlite_code::CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            sqlite_code::CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// Errors that mean "another transaction got there first; try again".
fn is_contention(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    if db.is_unique_violation() {
        return true;
    }
    if let Some(code) = sqlite_code(db.as_ref()) {
        return code == sqlite_code::BUSY_SNAPSHOT;
    }
    // PostgreSQL: serialization_failure, deadlock_detected, lock_not_available.
    db.code()
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01" | "55P03"))
}

/// Errors that mean "the database cannot take this now" (see [`LedgerError::is_unavailable`]):
/// the connection failed or was lost, the pool timed out or closed; SQLite BUSY/LOCKED (past
/// the busy timeout), FULL, IOERR, CANTOPEN, READONLY (all with their extended codes);
/// PostgreSQL `admin_shutdown`, `crash_shutdown`, `cannot_connect_now` (57P01–57P03),
/// `too_many_connections` (53300), `disk_full` (53100), `insufficient_resources` (53000),
/// `out_of_memory` (53200) and the connection-exception class (08xxx). Constraint and
/// serialization errors are not outages.
pub(crate) fn is_outage(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            if let Some(code) = sqlite_code(db.as_ref()) {
                return code != sqlite_code::BUSY_SNAPSHOT
                    && matches!(
                        code & 0xff,
                        sqlite_code::BUSY
                            | sqlite_code::LOCKED
                            | sqlite_code::READONLY
                            | sqlite_code::IOERR
                            | sqlite_code::FULL
                            | sqlite_code::CANTOPEN
                    );
            }
            db.code().is_some_and(|code| {
                matches!(
                    code.as_ref(),
                    "57P01" | "57P02" | "57P03" | "53000" | "53100" | "53200" | "53300"
                ) || code.starts_with("08")
            })
        }
        _ => false,
    }
}

/// Shorthand used throughout the crate.
pub(crate) type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Adds context to driver results.
pub(crate) trait SqlxResultExt<T> {
    /// Wraps a driver error with what the ledger was doing.
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> SqlxResultExt<T> for std::result::Result<T, sqlx::Error> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|e| LedgerError::from_sqlx(context, e))
    }
}

#[cfg(test)]
mod tests {
    //! The classification on real driver errors: each error is produced by SQLite (or
    //! PostgreSQL, when the test server answers) and classified by [`LedgerError::from_sqlx`].
    #![allow(clippy::unwrap_used, reason = "test set-up: a panic is a failed test")]

    use std::str::FromStr as _;
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    use sqlx::{ConnectOptions as _, Connection as _, Executor as _};

    use super::*;

    /// A report that prints the error's chain (`{:#}`, the binaries') names the driver's
    /// message once: it was printed by the message, again as the source, and again as the
    /// driver error's own source.
    #[test]
    fn a_report_of_the_chain_names_the_driver_error_once() {
        for error in [
            LedgerError::from_sqlx(
                "read the disk",
                sqlx::Error::Io(std::io::Error::other("disk on fire")),
            ),
            LedgerError::from_sqlx("decode a row", sqlx::Error::Protocol("disk on fire".into())),
        ] {
            let mut report = error.to_string();
            let mut cause = std::error::Error::source(&error);
            while let Some(next) = cause {
                report.push_str(&format!(": {next}"));
                cause = next.source();
            }
            assert_eq!(report.matches("disk on fire").count(), 1, "{report}");
        }
    }

    fn classify(source: sqlx::Error) -> LedgerError {
        LedgerError::from_sqlx("test", source)
    }

    fn options(path: &std::path::Path) -> SqliteConnectOptions {
        SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
    }

    async fn table(path: &std::path::Path) -> sqlx::SqliteConnection {
        let mut conn = options(path).connect().await.unwrap();
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER CHECK (n > 0))")
            .await
            .unwrap();
        conn
    }

    #[tokio::test]
    async fn sqlite_write_lock_held_elsewhere_past_the_busy_timeout_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut holder = table(&path).await;
        holder.execute("BEGIN EXCLUSIVE").await.unwrap();
        let mut writer = options(&path)
            .busy_timeout(Duration::from_millis(50))
            .connect()
            .await
            .unwrap();
        let err = writer.execute("BEGIN IMMEDIATE").await.unwrap_err();
        let classified = classify(err);
        assert!(classified.is_unavailable(), "{classified:?}");
        assert!(!classified.is_retryable(), "{classified:?}");
        holder.execute("COMMIT").await.unwrap();
        writer.execute("BEGIN IMMEDIATE").await.unwrap();
    }

    #[tokio::test]
    async fn sqlite_read_only_and_unopenable_files_are_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(table(&path).await);
        let mut read_only = options(&path).read_only(true).connect().await.unwrap();
        let err = read_only
            .execute("INSERT INTO t (id, n) VALUES (1, 1)")
            .await
            .unwrap_err();
        assert!(classify(err).is_unavailable());

        let missing = dir.path().join("no-such-dir").join("t.db");
        let err = SqliteConnectOptions::from_str(&format!("sqlite://{}", missing.display()))
            .unwrap()
            .create_if_missing(true)
            .connect()
            .await
            .unwrap_err();
        assert!(classify(err).is_unavailable());
    }

    #[tokio::test]
    async fn sqlite_constraint_errors_are_not_outages() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = table(&dir.path().join("t.db")).await;
        conn.execute("INSERT INTO t (id, n) VALUES (1, 1)")
            .await
            .unwrap();
        let duplicate = conn
            .execute("INSERT INTO t (id, n) VALUES (1, 1)")
            .await
            .unwrap_err();
        assert!(matches!(classify(duplicate), LedgerError::Conflict { .. }));
        let check = conn
            .execute("INSERT INTO t (id, n) VALUES (2, 0)")
            .await
            .unwrap_err();
        assert!(matches!(classify(check), LedgerError::Database { .. }));
        let syntax = conn
            .execute("INSERT INTO nowhere VALUES (1)")
            .await
            .unwrap_err();
        assert!(matches!(classify(syntax), LedgerError::Database { .. }));
    }

    #[test]
    fn pool_and_connection_failures_are_unavailable() {
        for error in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        ] {
            assert!(classify(error).is_unavailable());
        }
        assert!(!classify(sqlx::Error::RowNotFound).is_unavailable());
    }

    /// PostgreSQL: a backend terminated by an administrator (57P01, or the lost connection)
    /// is an outage; a unique violation is a lost race; a check violation is neither.
    #[tokio::test]
    async fn postgres_admin_shutdown_is_unavailable_and_constraints_are_not() {
        let Some(db) = phrony_test_support::postgres::PgDatabase::create().await else {
            return;
        };
        let mut victim = sqlx::PgConnection::connect(db.url()).await.unwrap();
        let mut admin = sqlx::PgConnection::connect(db.url()).await.unwrap();
        victim
            .execute("CREATE TABLE t (id INT PRIMARY KEY, n INT CHECK (n > 0))")
            .await
            .unwrap();
        victim.execute("INSERT INTO t VALUES (1, 1)").await.unwrap();
        let duplicate = victim
            .execute("INSERT INTO t VALUES (1, 1)")
            .await
            .unwrap_err();
        assert!(matches!(classify(duplicate), LedgerError::Conflict { .. }));
        let check = victim
            .execute("INSERT INTO t VALUES (2, 0)")
            .await
            .unwrap_err();
        assert!(matches!(classify(check), LedgerError::Database { .. }));

        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut victim)
            .await
            .unwrap();
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut admin)
            .await
            .unwrap();
        let err = victim.execute("SELECT 1").await.unwrap_err();
        let classified = classify(err);
        assert!(classified.is_unavailable(), "{classified:?}");
        admin.close().await.unwrap();
    }
}
