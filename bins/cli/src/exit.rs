//! The one place where a command's outcome becomes a process exit code.
//!
//! | Code | Meaning |
//! |---|---|
//! | 0 | success (warnings, if any, went to stderr) |
//! | 1 | invalid input, validation failure or failed operation; `Error: …` on stderr |
//! | 2 | usage error: unknown command or flag, missing or malformed argument (printed by clap) |

use std::fmt;
use std::io::{self, ErrorKind};
use std::process::ExitCode;

/// Exit code of a command that failed (invalid input, validation failure, operation error).
const FAILURE: u8 = 1;

/// Maps a command's outcome to the process exit code, printing the error to stderr.
///
/// A closed stdout (`phrony schema | head`) is not an error: the reader got what it wanted.
pub(crate) fn code(outcome: anyhow::Result<()>) -> ExitCode {
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
    eprintln!("Error: {err:#}");
    if let Some(hinted) = err.chain().find_map(|cause| cause.downcast_ref::<Hinted>()) {
        for line in hinted.hint.lines() {
            eprintln!("  {line}");
        }
    }
    ExitCode::from(FAILURE)
}

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
