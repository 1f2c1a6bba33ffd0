//! Errors: [`StoreError`] from a [`crate::LedgerStore`], [`EngineError`] from the engine's API.

use std::fmt;

use phrony_ledger::LedgerError;

/// The class of a failure, mapping onto gRPC status codes (one class each, except
/// [`ErrorKind::Fenced`], which is `Unavailable` like [`ErrorKind::Unavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `NotFound`: the session, approval or tool call does not exist.
    NotFound,
    /// `FailedPrecondition`: the request is valid but the current state forbids it.
    FailedPrecondition,
    /// `AlreadyExists`.
    AlreadyExists,
    /// `PermissionDenied`: the caller may not take this action (separation of duties, an
    /// approver's route restriction).
    PermissionDenied,
    /// `InvalidArgument`: the caller passed something malformed.
    InvalidArgument,
    /// `Aborted`: a concurrent writer won a race; retrying may succeed.
    Conflict,
    /// `ResourceExhausted`: a configured bound is reached (queued user messages of a session,
    /// live sessions of an agent); the message names the bound and its variable. Retrying
    /// after the backlog shrinks may succeed.
    ResourceExhausted,
    /// `Unavailable`: the database cannot be reached.
    Unavailable,
    /// `Unavailable`, retryable: the write was refused because this replica lost the session's
    /// lease (issue #20) — another replica drives the session now, and the request retried
    /// (here or there) goes through. Not a database outage: nothing is suspended for it.
    Fenced,
    /// `Internal`: anything else (database errors, corrupt data, bugs).
    Internal,
}

impl ErrorKind {
    /// A stable snake_case name (`not_found`, `failed_precondition`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::FailedPrecondition => "failed_precondition",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::InvalidArgument => "invalid_argument",
            Self::Conflict => "conflict",
            Self::ResourceExhausted => "resource_exhausted",
            Self::Unavailable => "unavailable",
            Self::Fenced => "fenced",
            Self::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure of a [`crate::LedgerStore`] operation.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// The class of failure.
    pub kind: ErrorKind,
    /// A user-facing message (the ledger's wording).
    pub message: String,
    /// The underlying error, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A store error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// `NotFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// `FailedPrecondition`.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }

    /// `InvalidArgument`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// `AlreadyExists`.
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AlreadyExists, message)
    }

    /// `Internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl From<LedgerError> for StoreError {
    fn from(error: LedgerError) -> Self {
        if let LedgerError::Fenced { session_id, .. } = &error {
            return Self {
                kind: ErrorKind::Fenced,
                message: format!(
                    "session {session_id} is driven by another replica now; retry the request"
                ),
                source: Some(Box::new(error)),
            };
        }
        let kind = match &error {
            LedgerError::NotFound { .. } => ErrorKind::NotFound,
            LedgerError::FailedPrecondition { .. } => ErrorKind::FailedPrecondition,
            LedgerError::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            LedgerError::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            LedgerError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            LedgerError::Conflict { .. } => ErrorKind::Conflict,
            LedgerError::ResourceExhausted { .. } => ErrorKind::ResourceExhausted,
            LedgerError::Unavailable { .. } => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        };
        Self {
            kind,
            message: error.to_string(),
            source: Some(Box::new(error)),
        }
    }
}

/// A failure of an [`crate::Engine`] operation.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct EngineError {
    /// The class of failure (maps onto a gRPC code).
    pub kind: ErrorKind,
    /// A user-facing message.
    pub message: String,
    /// The underlying error, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl EngineError {
    /// An engine error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// `InvalidArgument`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// `FailedPrecondition`.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }

    /// `NotFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// `ResourceExhausted`.
    pub fn exhausted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ResourceExhausted, message)
    }
}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        Self {
            kind: error.kind,
            message: error.message.clone(),
            source: Some(Box::new(error)),
        }
    }
}

/// The result type of store operations.
pub type StoreResult<T> = Result<T, StoreError>;
