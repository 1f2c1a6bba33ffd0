//! Running the real `phrony` CLI from a test and reading what it printed.
//!
//! ```no_run
//! use tests::cli::{json, ok, phrony};
//! use tests::daemon::{Backend, Daemon};
//! let Some(daemon) = Daemon::start(Backend::Sqlite) else { return };
//! let agents = json(&ok(phrony(&daemon, "ci").args(["agents", "ls", "--output", "json"])));
//! assert!(agents.is_object());
//! ```

use std::process::Command;

use serde_json::Value;

use crate::daemon::Daemon;

/// What a command printed and how it exited.
#[derive(Debug)]
pub struct Out {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `cmd` to completion.
///
/// # Panics
/// When the command cannot be started or prints something that is not UTF-8.
pub fn run(cmd: &mut Command) -> Out {
    let shown = format!("{cmd:?}");
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{shown} printed non-UTF-8: {e}"))
    };
    Out {
        code: output.status.code(),
        stdout: text(output.stdout),
        stderr: text(output.stderr),
    }
}

/// Runs a command that must exit 0 without writing to stderr (no warning, no diagnostic);
/// returns stdout.
///
/// # Panics
/// When the command fails or writes to stderr; the message holds both outputs.
pub fn ok(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = run(cmd);
    assert_eq!(
        out.code,
        Some(0),
        "{shown} failed:\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stderr, "", "{shown} wrote to stderr");
    out.stdout
}

/// Runs a command that must fail with exit code 1 and nothing on stdout; returns stderr.
///
/// # Panics
/// When the command exits otherwise or prints on stdout.
pub fn fails(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = run(cmd);
    assert_eq!(
        out.code,
        Some(1),
        "{shown} should fail:\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stdout, "", "{shown} printed on failure");
    out.stderr
}

/// Parses a command's JSON output.
///
/// # Panics
/// When `stdout` is not JSON; the message holds it.
#[must_use]
pub fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// The rows of a table, split on runs of two or more spaces; the header row first.
#[must_use]
pub fn table(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|cell| !cell.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The CLI pointed at `daemon`, acting as `actor` (`PHRONY_ACTOR`). `PHRONY_NO_TUI` is removed
/// so that the renderer never depends on the environment the tests run in.
#[must_use]
pub fn phrony(daemon: &Daemon, actor: &str) -> Command {
    let mut cmd = daemon.phrony();
    cmd.env("PHRONY_ACTOR", actor).env_remove("PHRONY_NO_TUI");
    cmd
}
