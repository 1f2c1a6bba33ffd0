//! [`ClientError`]: why a call to the runtime failed, in terms a CLI can render.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::time::Duration;

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The runtime address does not parse as `host:port` or an `http://` URI.
    #[error("invalid runtime address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The bearer token (`PHRONY_TOKEN`, `--token`) cannot be sent.
    #[error("invalid token: {reason}")]
    InvalidToken {
        /// What is wrong with it (never the token itself).
        reason: String,
    },
    /// The TLS settings cannot be used: a CA, certificate or key file that cannot be read or
    /// holds no PEM, a key without a certificate, or `https://` without a CA.
    #[error("TLS: {reason}")]
    Tls {
        /// What is wrong, naming the file.
        reason: String,
    },
    /// No connection to the runtime: nothing listens there, the host does not resolve, the
    /// connection was reset, or connecting timed out.
    #[error("cannot reach the phrony runtime at {addr} ({reason})")]
    Unreachable {
        /// The address that was tried (as given, without scheme).
        addr: String,
        /// A short lower-case reason: `connection refused`, `timed out after 5s`, …
        reason: String,
    },
    /// The connection broke after the request may have reached the runtime, before its answer
    /// arrived (reset, closed, or lost): the runtime may have carried the request out. For a
    /// change (a vote, a cancel, a deploy) check its state before retrying.
    #[error(
        "the connection to the phrony runtime at {addr} was lost before it answered ({reason}); \
         the request may have been carried out"
    )]
    ConnectionLost {
        /// The address of the runtime.
        addr: String,
        /// A short lower-case reason: `connection reset`, `connection closed`, …
        reason: String,
    },
    /// The actor cannot travel in the `phrony-actor` request header (only visible ASCII can).
    #[error(
        "actor {actor:?} cannot be sent to the runtime: only visible ASCII characters can name an actor"
    )]
    InvalidActor {
        /// The actor as given.
        actor: String,
    },
    /// The runtime did not answer within the request timeout.
    #[error("the phrony runtime at {addr} did not answer within {}s", timeout.as_secs())]
    Timeout {
        /// The address of the runtime.
        addr: String,
        /// The per-request timeout that expired.
        timeout: Duration,
    },
    /// The runtime answered with a gRPC error status.
    #[error("{message} ({})", code.name())]
    Rpc {
        /// The status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// The runtime answered, but with a response this client cannot read (a malformed timestamp,
    /// a manifest that is not UTF-8…): a runtime bug or an incompatible runtime version.
    #[error("unexpected {rpc} response from the runtime: {reason}")]
    InvalidResponse {
        /// The RPC whose response is malformed.
        rpc: &'static str,
        /// What is malformed.
        reason: String,
    },
}

impl ClientError {
    /// The gRPC status code, when the runtime answered with one.
    #[must_use]
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the runtime could not be reached at all (as opposed to refusing the call).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }

    /// True when the request may have been carried out although the call failed: the
    /// connection was lost after sending ([`ClientError::ConnectionLost`]) or the answer did
    /// not come in time ([`ClientError::Timeout`]).
    #[must_use]
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Self::ConnectionLost { .. } | Self::Timeout { .. })
    }

    /// Classifies a failed call: a status the server sent stays [`ClientError::Rpc`]; a status
    /// synthesised by the transport (it carries a source error) is a failure to connect (the
    /// request was never sent: [`ClientError::Unreachable`]), a timeout, or a connection lost
    /// while the call was under way ([`ClientError::ConnectionLost`]).
    pub(crate) fn from_status(status: &tonic::Status, addr: &str, timeout: Duration) -> Self {
        if let Some(source) = status.source() {
            if status.code() == tonic::Code::Cancelled
                && chain(source).any(|e| e.is::<tonic::TimeoutExpired>())
            {
                return Self::Timeout {
                    addr: addr.to_owned(),
                    timeout,
                };
            }
            let reason = connection_failure(source);
            if let Some(reason) = reason.as_ref().filter(|r| never_sent(r)) {
                return Self::Unreachable {
                    addr: addr.to_owned(),
                    reason: reason.clone(),
                };
            }
            return Self::ConnectionLost {
                addr: addr.to_owned(),
                reason: reason.unwrap_or_else(|| lost_reason(status, source)),
            };
        }
        Self::Rpc {
            code: Code::from(status.code()),
            message: status.message().to_owned(),
        }
    }

    /// Classifies a failure to open the channel.
    pub(crate) fn from_transport(
        error: &tonic::transport::Error,
        addr: &str,
        connect_timeout: Duration,
    ) -> Self {
        let reason = connection_failure(error).unwrap_or_else(|| {
            // The innermost cause is the most specific one (`tcp connect error` says little).
            chain(error)
                .last()
                .map_or_else(|| error.to_string(), ToString::to_string)
        });
        let reason = if reason == "timed out" {
            format!("timed out after {}s", connect_timeout.as_secs())
        } else {
            reason
        };
        Self::Unreachable {
            addr: addr.to_owned(),
            reason,
        }
    }

    pub(crate) fn invalid_response(rpc: &'static str, reason: impl fmt::Display) -> Self {
        Self::InvalidResponse {
            rpc,
            reason: reason.to_string(),
        }
    }
}

/// The error and its sources, outermost first.
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source())
}

/// Whether a [`connection_failure`] reason means no connection was made, so no request left.
fn never_sent(reason: &str) -> bool {
    matches!(
        reason,
        "connection refused"
            | "cannot resolve the host name"
            | "host unreachable"
            | "network unreachable"
            | "address not available"
    )
}

/// A short reason for a connection lost without an I/O error (the peer closed it).
fn lost_reason(status: &tonic::Status, source: &(dyn std::error::Error + 'static)) -> String {
    let inner = chain(source)
        .last()
        .map_or_else(|| status.message().to_owned(), ToString::to_string);
    if inner.is_empty() {
        "connection closed".to_owned()
    } else {
        inner
    }
}

/// A short reason when `error` is a failure to connect (or a lost connection).
fn connection_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let io = chain(error).find_map(|e| e.downcast_ref::<io::Error>());
    if let Some(io) = io {
        let reason = match io.kind() {
            io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
            io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
            io::ErrorKind::ConnectionAborted => "connection aborted".to_owned(),
            io::ErrorKind::NotConnected | io::ErrorKind::BrokenPipe => "connection lost".to_owned(),
            io::ErrorKind::TimedOut => "timed out".to_owned(),
            io::ErrorKind::AddrNotAvailable => "address not available".to_owned(),
            io::ErrorKind::HostUnreachable => "host unreachable".to_owned(),
            io::ErrorKind::NetworkUnreachable => "network unreachable".to_owned(),
            _ => {
                // DNS failures surface as an io error whose text names the lookup.
                let text = io.to_string();
                if text.contains("failed to lookup") || text.contains("Name or service") {
                    "cannot resolve the host name".to_owned()
                } else {
                    text
                }
            }
        };
        return Some(reason);
    }
    if chain(error).any(|e| e.is::<tonic::ConnectError>()) {
        return Some(
            chain(error)
                .last()
                .map_or_else(String::new, ToString::to_string),
        );
    }
    None
}

/// A gRPC status code, named as the gRPC specification names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// `OK` (never an error; listed for completeness).
    Ok,
    /// `CANCELLED`.
    Cancelled,
    /// `UNKNOWN`.
    Unknown,
    /// `INVALID_ARGUMENT`.
    InvalidArgument,
    /// `DEADLINE_EXCEEDED`.
    DeadlineExceeded,
    /// `NOT_FOUND`.
    NotFound,
    /// `ALREADY_EXISTS`.
    AlreadyExists,
    /// `PERMISSION_DENIED`.
    PermissionDenied,
    /// `RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// `FAILED_PRECONDITION`.
    FailedPrecondition,
    /// `ABORTED`.
    Aborted,
    /// `OUT_OF_RANGE`.
    OutOfRange,
    /// `UNIMPLEMENTED`.
    Unimplemented,
    /// `INTERNAL`.
    Internal,
    /// `UNAVAILABLE`.
    Unavailable,
    /// `DATA_LOSS`.
    DataLoss,
    /// `UNAUTHENTICATED`.
    Unauthenticated,
}

impl Code {
    /// The CamelCase name the reference CLI prints in parentheses: `AlreadyExists`,
    /// `FailedPrecondition`, …
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Cancelled => "Canceled",
            Self::Unknown => "Unknown",
            Self::InvalidArgument => "InvalidArgument",
            Self::DeadlineExceeded => "DeadlineExceeded",
            Self::NotFound => "NotFound",
            Self::AlreadyExists => "AlreadyExists",
            Self::PermissionDenied => "PermissionDenied",
            Self::ResourceExhausted => "ResourceExhausted",
            Self::FailedPrecondition => "FailedPrecondition",
            Self::Aborted => "Aborted",
            Self::OutOfRange => "OutOfRange",
            Self::Unimplemented => "Unimplemented",
            Self::Internal => "Internal",
            Self::Unavailable => "Unavailable",
            Self::DataLoss => "DataLoss",
            Self::Unauthenticated => "Unauthenticated",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<tonic::Code> for Code {
    fn from(code: tonic::Code) -> Self {
        match code {
            tonic::Code::Ok => Self::Ok,
            tonic::Code::Cancelled => Self::Cancelled,
            tonic::Code::Unknown => Self::Unknown,
            tonic::Code::InvalidArgument => Self::InvalidArgument,
            tonic::Code::DeadlineExceeded => Self::DeadlineExceeded,
            tonic::Code::NotFound => Self::NotFound,
            tonic::Code::AlreadyExists => Self::AlreadyExists,
            tonic::Code::PermissionDenied => Self::PermissionDenied,
            tonic::Code::ResourceExhausted => Self::ResourceExhausted,
            tonic::Code::FailedPrecondition => Self::FailedPrecondition,
            tonic::Code::Aborted => Self::Aborted,
            tonic::Code::OutOfRange => Self::OutOfRange,
            tonic::Code::Unimplemented => Self::Unimplemented,
            tonic::Code::Internal => Self::Internal,
            tonic::Code::Unavailable => Self::Unavailable,
            tonic::Code::DataLoss => Self::DataLoss,
            tonic::Code::Unauthenticated => Self::Unauthenticated,
        }
    }
}
