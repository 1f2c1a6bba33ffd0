//! `phrony bundles run NS/NAME[@VERSION]`: start a session of a bundle's active deployment (its
//! root agent), as `phrony run` starts one of an agent.
//!
//! The secrets are the union its members declare (`GetBundleSecretRequirements`), resolved as
//! `phrony run` resolves an agent's: each variable from the environment, else from the
//! `--env-file` files. Values are sent to the runtime, never printed.

use phrony_client::RunTarget;

use crate::cmd::{Global, run};

/// Arguments of `phrony bundles run`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Secrets: each secret a member of the deployed version declares (secrets.<name>.fromEnv: VAR;
see `phrony bundles secret-requirements`) is read from the environment variable VAR, else from
the --env-file files (dotenv: KEY=VALUE, `export`, quotes, # comments). The environment wins
over the files; a later file wins over an earlier one.")]
pub(crate) struct Args {
    /// The bundle: namespace/name, or namespace/name@version (semver or sha256: lock hash; it
    /// must be the active deployment).
    bundle: String,
    #[command(flatten)]
    options: run::Options,
}

/// Starts the session and prints `session <id> started (status: <status>)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    run::start(RunTarget::Bundle, &args.bundle, &args.options, global)
}
