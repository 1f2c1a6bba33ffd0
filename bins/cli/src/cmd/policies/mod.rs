//! `phrony policies …`: policy dry runs.

mod check;

/// Subcommands of `phrony policies`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Dry-run the agent's policies against one tool call and explain the decision.
    Check(check::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Check(args) => check::run(&args),
        }
    }
}
