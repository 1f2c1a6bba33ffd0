//! `phrony bundles validate BUNDLE [--require-lock]`: walk the closure and check the lock.

use std::io::{self, Write as _};
use std::path::PathBuf;

use phrony_manifest::SecretRequirement;
use serde_json::json;

use crate::cmd::{Output, manifest, render};

/// Arguments of `phrony bundles validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Bundle manifest (bundle.yaml).
    bundle: PathBuf,
    /// Fail when no bundle.lock.json is committed beside the bundle.
    #[arg(long)]
    require_lock: bool,
    /// Output format (warnings stay on stderr either way).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `valid: <namespace>/<name> <lock hash>` and the members, warning about secrets unset in
/// this environment.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let validated = phrony_manifest::validate_bundle(&args.bundle, args.require_lock)
        .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    let bundle = &validated.bundle;
    manifest::print_diagnostics(&bundle.warnings)?;
    let secrets: Vec<SecretRequirement> = validated
        .secrets
        .iter()
        .map(|s| SecretRequirement {
            name: s.name.clone(),
            from_env: s.from_env.clone(),
        })
        .collect();
    manifest::warn_unset_secrets(&secrets)?;

    let root = bundle
        .root()
        .map(|m| m.child_name.as_str())
        .unwrap_or_default();
    let lock_hash = match &validated.lock {
        Some(lock) => lock.version.clone(),
        // Without a committed lock, show what `bundles lock` would write.
        None => bundle
            .compute_lock()
            .map(|l| l.version)
            .unwrap_or_else(|_| "unlocked".into()),
    };
    if args.output == Output::Json {
        if validated.lock.is_none() {
            writeln!(
                io::stderr().lock(),
                "warning: no committed lock; run phrony bundles lock"
            )?;
        }
        return render::json(&json!({
            "valid": true,
            "namespace": bundle.namespace,
            "name": bundle.name,
            "lock_hash": lock_hash,
            "locked": validated.lock.is_some(),
            "members": bundle.members.len(),
            "root": root,
        }));
    }
    let mut stdout = io::stdout().lock();
    writeln!(
        stdout,
        "valid: {}/{} {lock_hash}",
        bundle.namespace, bundle.name
    )?;
    writeln!(stdout, "members: {} (root: {root})", bundle.members.len())?;
    if validated.lock.is_none() {
        drop(stdout);
        writeln!(
            io::stderr().lock(),
            "warning: no committed lock; run phrony bundles lock"
        )?;
    }
    Ok(())
}
