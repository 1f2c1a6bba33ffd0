//! `phrony policies …`: policy dry runs, and replays of stored calls under a candidate.

mod check;
mod replay;

use crate::cmd::Global;

/// Subcommands of `phrony policies`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Dry-run the agent's policies against one tool call and explain the decision.
    Check(check::Args),
    /// Re-decide a deployed agent's stored calls under a candidate manifest and report every
    /// decision that would flip (exit 5 when one would).
    Replay(replay::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Check(args) => check::run(&args),
            Self::Replay(args) => replay::run(&args, global),
        }
    }
}
