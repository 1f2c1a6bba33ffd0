//! The one place where a command's outcome becomes a process exit code.
//!
//! | Code | Meaning |
//! |---|---|
//! | 0 | success (warnings, if any, went to stderr) |
//! | 1 | invalid input, validation failure or failed operation; `Error: …` on stderr |
//! | 2 | usage error: unknown command or flag, missing or malformed argument (printed by clap) |

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
    ExitCode::from(FAILURE)
}
