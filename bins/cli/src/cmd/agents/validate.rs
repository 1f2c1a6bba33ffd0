//! `phrony agents validate MANIFEST`: parse, validate and compile an agent locally.

use std::path::PathBuf;

use serde_json::json;

use crate::cmd::{Output, manifest, render};

/// Arguments of `phrony agents validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Agent manifest (agent.yaml).
    manifest: PathBuf,
    /// Output format (warnings stay on stderr either way).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `valid: <namespace>/<name> <version>`, warning about secrets unset in this environment.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let agent = manifest::load_agent(&args.manifest)?;
    manifest::warn_unset_secrets(&agent.secret_requirements())?;
    let meta = &agent.metadata;
    match args.output {
        Output::Json => render::json(&json!({
            "valid": true,
            "namespace": meta.namespace,
            "name": meta.name,
            "version": meta.version,
            "content_hash": agent.content_hash(),
            "unset_secrets": agent
                .secret_requirements()
                .iter()
                .filter(|s| s.is_missing_from_env(|name| std::env::var_os(name)))
                .map(|s| json!({"name": s.name, "from_env": s.from_env}))
                .collect::<Vec<_>>(),
        })),
        Output::Text => render::line(format_args!(
            "valid: {}/{} {}",
            meta.namespace, meta.name, meta.version
        )),
    }
}
