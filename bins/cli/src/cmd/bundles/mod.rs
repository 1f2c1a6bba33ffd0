//! `phrony bundles …`: local operations on bundles of vendored agents.

mod lock;
mod validate;

/// Subcommands of `phrony bundles`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Walk the bundle's closure and write bundle.lock.json beside the bundle manifest.
    Lock(lock::Args),
    /// Walk the bundle's closure and check it against the committed bundle.lock.json.
    Validate(validate::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Lock(args) => lock::run(&args),
            Self::Validate(args) => validate::run(&args),
        }
    }
}
