//! `phrony policies …`: policy dry runs, replays of stored calls under a candidate, and
//! shadow-mode reports.

mod check;
mod replay;
mod shadow_report;

use crate::cmd::Global;

/// Subcommands of `phrony policies`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Dry-run the agent's policies against one tool call and explain the decision.
    Check(check::Args),
    /// Re-decide a deployed agent's stored calls under a candidate manifest and report every
    /// decision that would flip (exit 5 when one would).
    Replay(replay::Args),
    /// List the calls a `mode: shadow` policy would have denied or held for approval.
    ShadowReport(shadow_report::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Check(args) => check::run(&args),
            Self::Replay(args) => replay::run(&args, global),
            Self::ShadowReport(args) => shadow_report::run(&args, global),
        }
    }
}
