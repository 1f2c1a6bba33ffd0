//! `phrony bundles lock BUNDLE`: walk the closure and write `bundle.lock.json`.

use std::io::{self, Write as _};
use std::path::PathBuf;

use serde_json::json;

use crate::cmd::{Output, manifest, render};

/// Arguments of `phrony bundles lock`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Bundle manifest (bundle.yaml).
    bundle: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Writes the lock beside the bundle and prints its hash and members.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let locked = phrony_manifest::lock_bundle(&args.bundle)
        .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    manifest::print_diagnostics(&locked.bundle.warnings)?;
    let bundle = &locked.bundle;
    if args.output == Output::Json {
        return render::json(&json!({
            "namespace": bundle.namespace,
            "name": bundle.name,
            "lock_hash": locked.lock.version,
            "members": bundle.members.len(),
            "root": locked.lock.root_child_name,
        }));
    }
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
