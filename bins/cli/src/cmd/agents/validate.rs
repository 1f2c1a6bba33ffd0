//! `phrony agents validate MANIFEST`: parse, validate and compile an agent locally.

use std::io::{self, Write as _};
use std::path::PathBuf;

use crate::cmd::manifest;

/// Arguments of `phrony agents validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Agent manifest (agent.yaml).
    manifest: PathBuf,
}

/// Prints `valid: <namespace>/<name> <version>`, warning about secrets unset in this environment.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let agent = manifest::load_agent(&args.manifest)?;
    manifest::warn_unset_secrets(&agent.secret_requirements())?;
    let meta = &agent.metadata;
    writeln!(
        io::stdout().lock(),
        "valid: {}/{} {}",
        meta.namespace,
        meta.name,
        meta.version
    )?;
    Ok(())
}
