//! `phrony agents validate MANIFEST [--mcp]`: parse, validate and compile an agent locally;
//! with `--mcp`, also check its MCP-backed bindings against their servers (`mcp_check.rs`).
//! The policy analysis' findings are printed as warnings; `--deny-warnings` makes any warning
//! fatal.

use std::path::PathBuf;

use serde_json::json;

use phrony_manifest::Finding;

use crate::cmd::{Output, manifest, render};

/// Arguments of `phrony agents validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Agent manifest (agent.yaml).
    manifest: PathBuf,
    /// Output format (warnings stay on stderr either way).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
    /// Also connect to every MCP server the bindings use (auth secrets from their fromEnv
    /// variables) and check its tools/list: a bound tool the server does not list is an error,
    /// an input_schema that differs from the server's inputSchema a warning, both reported at
    /// the binding's file:line:column.
    #[arg(long)]
    mcp: bool,
    /// Exit non-zero when there is any warning (load warnings and the policy analysis': conditions
    /// that can never match the tool's input_schema or never hold, policies that never decide,
    /// allow lists that allow everything).
    #[arg(long)]
    deny_warnings: bool,
}

/// Prints `valid: <namespace>/<name> <version>`, then one `shadow: <policy>` line per `mode:
/// shadow` policy, warning about secrets unset in this environment.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let compiled = manifest::load_compiled(&args.manifest)?;
    manifest::print_findings(&compiled.findings)?;
    if args.deny_warnings {
        let count = compiled.warnings.len() + compiled.findings.len();
        if count > 0 {
            anyhow::bail!("{count} warnings, and --deny-warnings makes warnings fatal");
        }
    }
    let agent = compiled.agent;
    manifest::warn_unset_secrets(&agent.secret_requirements())?;
    let mcp_checked = if args.mcp {
        let (diags, checked) = super::mcp_check::check(&agent, &args.manifest)?;
        let errors = diags.iter().filter(|d| d.is_error()).count();
        manifest::print_diagnostics(&diags)?;
        if errors > 0 {
            anyhow::bail!("MCP bindings do not match their servers ({errors} errors)");
        }
        Some(checked)
    } else {
        None
    };
    let meta = &agent.metadata;
    let shadow: Vec<String> = agent
        .spec
        .policies
        .iter()
        .filter(|p| p.mode == "shadow")
        .map(phrony_manifest::CompiledPolicy::qualified_name)
        .collect();
    match args.output {
        Output::Json => render::json(&json!({
            "valid": true,
            "namespace": meta.namespace,
            "name": meta.name,
            "version": meta.version,
            "content_hash": agent.content_hash(),
            "mcp_bindings_checked": mcp_checked,
            "shadow_policies": shadow,
            "findings": compiled.findings.iter().map(Finding::to_json).collect::<Vec<_>>(),
            "unset_secrets": agent
                .secret_requirements()
                .iter()
                .filter(|s| s.is_missing_from_env(|name| std::env::var_os(name)))
                .map(|s| json!({"name": s.name, "from_env": s.from_env}))
                .collect::<Vec<_>>(),
        })),
        Output::Text => {
            match mcp_checked {
                Some(n) => render::line(format_args!(
                    "valid: {}/{} {} ({n} MCP bindings checked against their servers)",
                    meta.namespace, meta.name, meta.version
                ))?,
                None => render::line(format_args!(
                    "valid: {}/{} {}",
                    meta.namespace, meta.name, meta.version
                ))?,
            }
            for policy in &shadow {
                render::line(format_args!(
                    "shadow: {policy} (evaluated and recorded on every call, never enforced)"
                ))?;
            }
            Ok(())
        }
    }
}
