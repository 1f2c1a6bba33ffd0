//! `phrony bundles lock BUNDLE`: walk the closure and write `bundle.lock.json`.

use std::io::{self, Write as _};
use std::path::PathBuf;

use crate::cmd::manifest;

/// Arguments of `phrony bundles lock`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Bundle manifest (bundle.yaml).
    bundle: PathBuf,
}

/// Writes the lock beside the bundle and prints its hash and members.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let locked = phrony_manifest::lock_bundle(&args.bundle)
        .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    manifest::print_diagnostics(&locked.bundle.warnings)?;
    let bundle = &locked.bundle;
    let mut stdout = io::stdout().lock();
    writeln!(
        stdout,
        "locked: {}/{} {}",
        bundle.namespace, bundle.name, locked.lock.version
    )?;
    writeln!(
        stdout,
        "members: {} (root: {})",
        bundle.members.len(),
        locked.lock.root_child_name
    )?;
    Ok(())
}
