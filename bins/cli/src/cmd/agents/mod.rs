//! `phrony agents …`: agent manifests.

mod validate;

/// Subcommands of `phrony agents`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Parse, validate and compile an agent manifest locally; warn about unset secret variables.
    Validate(validate::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Validate(args) => validate::run(&args),
        }
    }
}
