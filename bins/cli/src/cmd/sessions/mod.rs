//! `phrony sessions …`: list, inspect, cancel and complete sessions on the runtime.

mod inspect;
mod ls;
mod payload;
mod stop;

pub(crate) use inspect::write_inspection;

use crate::cmd::Global;

/// Subcommands of `phrony sessions`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List sessions, most recently updated first (root sessions unless --include-children).
    Ls(ls::Args),
    /// Show a session, its delegated children and its timeline of events, tool calls and approvals.
    Inspect(inspect::Args),
    /// Print one payload of a session whole (JSON), e.g. one `inspect` shortened.
    Payload(payload::Args),
    /// Cancel a session that has not ended (its queued and running tool calls are cancelled).
    Cancel(stop::Args),
    /// Complete a session that has not ended; its output is the last assistant message.
    Complete(stop::Args),
    /// Attach to a session: follow it live, answer approvals, send messages (TUI on a terminal).
    Attach(crate::cmd::attach::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Ls(args) => ls::run(&args, global),
            Self::Inspect(args) => inspect::run(&args, global),
            Self::Payload(args) => payload::run(&args, global),
            Self::Cancel(args) => stop::run(&args, global, stop::Stop::Cancel),
            Self::Complete(args) => stop::run(&args, global, stop::Stop::Complete),
            Self::Attach(args) => crate::cmd::attach::run(&args, global),
        }
    }
}

/// A session id argument: non-empty, without surrounding whitespace.
pub(crate) fn session_id(input: &str) -> anyhow::Result<&str> {
    let id = input.trim();
    if id.is_empty() {
        anyhow::bail!("session id must not be empty");
    }
    Ok(id)
}
