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
    /// The database URL or ledger options are unusable.
    #[error("{message}")]
    Config {
        /// What is wrong with the configuration and how to fix it.
        message: String,
    },
    /// The database cannot be reached (connect failure, pool timeout, I/O error).
    #[error("{context}: {source}")]
    Unavailable {
        /// What the ledger was doing, including the (password-free) database address.
        context: String,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },
    /// Any other database error.
    #[error("{context}: {source}")]
    Database {
        /// What the ledger was doing.
        context: Cow<'static, str>,
        /// The driver error.
        #[source]
        source: sqlx::Error,
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

    /// Classifies a driver error: lost races and lock timeouts become [`LedgerError::Conflict`],
    /// connectivity failures [`LedgerError::Unavailable`], everything else
    /// [`LedgerError::Database`].
    pub(crate) fn from_sqlx(context: impl Into<Cow<'static, str>>, source: sqlx::Error) -> Self {
        let context = context.into();
        if is_contention(&source) {
            return Self::Conflict {
                message: format!("{context}: concurrent update ({source})"),
            };
        }
        match source {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Self::Unavailable {
                context: context.into_owned(),
                source,
            },
            source => Self::Database { context, source },
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
    let Some(code) = db.code() else {
        return false;
    };
    match code.as_ref() {
        // PostgreSQL: serialization_failure, deadlock_detected, lock_not_available.
        "40001" | "40P01" | "55P03" => true,
        // SQLite reports the (extended) result code; BUSY = 5 and LOCKED = 6 plus extensions.
        other => other
            .parse::<i64>()
            .is_ok_and(|c| matches!(c & 0xff, 5 | 6)),
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
