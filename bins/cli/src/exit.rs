//! The one place where a command's outcome becomes a process exit code.
//!
//! | Code | Meaning |
//! |---|---|
//! | 0 | success (warnings, if any, went to stderr) |
//! | 1 | invalid input, validation failure or failed operation; `Error: …` on stderr |
//! | 2 | usage error: unknown command or flag, missing or malformed argument (printed by clap) |
//! | 3 | outcome unknown: the connection was lost after a change was sent ([`Unsure`]); it may have been recorded |
//! | 4 | access refused ([`AccessRefused`]): `UNAUTHENTICATED` (no credential, or a bad one) or `PERMISSION_DENIED` (the message names the missing permission) |
//! | 5 | `policies replay` found a stored decision that would flip ([`Flipped`]); the report is on stdout |

use std::fmt;
use std::io::{self, ErrorKind};
use std::process::ExitCode;

/// Exit code of a command that failed (invalid input, validation failure, operation error).
const FAILURE: u8 = 1;

/// Exit code of a change whose outcome is unknown ([`Unsure`]).
const UNSURE: u8 = 3;

/// Exit code of a call the runtime refused at its access edge ([`AccessRefused`]).
const ACCESS_REFUSED: u8 = 4;

/// Exit code of a replay that found decisions that would flip ([`Flipped`]).
const FLIPPED: u8 = 5;

/// Maps a command's outcome to the process exit code, printing the error to stderr.
///
/// A closed stdout (`phrony schema | head`) is not an error: the reader got what it wanted.
pub fn code(outcome: anyhow::Result<()>) -> ExitCode {
    let Err(err) = outcome else {
        return ExitCode::SUCCESS;
    };
    let broken_pipe = err
        .chain()
        .filter_map(|cause| cause.downcast_ref::<io::Error>())
        .any(|io| io.kind() == ErrorKind::BrokenPipe);
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    if let Some(flipped) = err.downcast_ref::<Flipped>() {
        eprintln!("{flipped}");
        return ExitCode::from(FLIPPED);
    }
    eprintln!("Error: {err:#}");
    let hint = err.chain().find_map(|cause| {
        cause
            .downcast_ref::<Hinted>()
            .map(|h| h.hint.as_str())
            .or_else(|| cause.downcast_ref::<Unsure>().map(|u| u.check.as_str()))
    });
    for line in hint.unwrap_or_default().lines() {
        eprintln!("  {line}");
    }
    if err.chain().any(|cause| cause.is::<Unsure>()) {
        return ExitCode::from(UNSURE);
    }
    if err.chain().any(|cause| cause.is::<AccessRefused>()) {
        return ExitCode::from(ACCESS_REFUSED);
    }
    ExitCode::from(FAILURE)
}

/// A change sent to the runtime whose outcome is unknown: the connection was lost (or the
/// answer timed out) after the request left, so the runtime may have recorded it. Printed like
/// a [`Hinted`] error (the hint says how to check) and exits with code 3, so scripts do not
/// retry a vote or a cancel blindly.
#[derive(Debug)]
pub(crate) struct Unsure {
    message: String,
    check: String,
}

impl Unsure {
    /// `message`, which says what may have happened, and `check`, how to find out (printed
    /// under it).
    pub(crate) fn new(message: impl Into<String>, check: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            check: check.into(),
        }
    }
}

impl fmt::Display for Unsure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Unsure {}

/// An error that comes with advice, printed on indented lines under the `Error: …` line:
///
/// ```text
/// Error: cannot reach the phrony runtime at 127.0.0.1:7777 (connection refused)
///   start it with: phrony-runtime  (or set --runtime-addr / PHRONY_RUNTIME_ADDR)
/// ```
#[derive(Debug)]
pub(crate) struct Hinted {
    message: String,
    hint: String,
}

impl Hinted {
    /// `message`, with `hint` (one or more lines) to print under it.
    pub(crate) fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            hint: hint.into(),
        }
    }
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Hinted {}

/// The runtime refused the call at its access edge: `UNAUTHENTICATED` or `PERMISSION_DENIED`.
/// Printed as one line and exits with code 4, so scripts can tell "who you are / what you may
/// do" from other failures.
#[derive(Debug)]
pub(crate) struct AccessRefused {
    message: String,
}

impl AccessRefused {
    /// The one line to print.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for AccessRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AccessRefused {}

/// `policies replay` found stored decisions the candidate would take differently. Not a
/// failure of the command (its report is on stdout): the one line goes to stderr without
/// `Error:` and the process exits with code 5, so CI can gate a policy change on it.
#[derive(Debug)]
pub(crate) struct Flipped {
    message: String,
}

impl Flipped {
    /// The one line to print, e.g. `1 stored decision would flip under …`.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for Flipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Flipped {}
