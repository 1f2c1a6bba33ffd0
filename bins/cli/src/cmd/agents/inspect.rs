//! `phrony agents inspect NS/NAME@VERSION`: one published version.

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent and version: namespace/name@version.
    agent: String,
    /// Output format (JSON includes the stored manifest).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `key: value` lines: agent, status, content_hash, published_at, published_by and,
/// when set, deprecated_at and retired_at; then one `pin:` line per tool a worker serves
/// (`tool@version sha256:…`, computed from the stored manifest by
/// `phrony_manifest::CompiledAgent::tool_pins`: the `descriptor_hash` its workers must
/// advertise, or none).
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let found = client
            .get_agent_version(&agent, &version)
            .await
            .map_err(remote::fails("inspect"))?;
        let pins =
            phrony_manifest::CompiledAgent::from_snapshot_json(found.manifest_json.as_bytes())
                .context("the runtime returned a stored manifest this client cannot read")?
                .tool_pins();
        match args.output {
            Output::Json => {
                let manifest: Value = serde_json::from_str(&found.manifest_json)
                    .context("the runtime returned a stored manifest that is not JSON")?;
                render::json(&json!({
                    "namespace": agent.namespace,
                    "name": agent.name,
                    "version": found.version,
                    "status": found.status().as_str(),
                    "content_hash": found.content_hash,
                    "published_at": render::time(found.published_at),
                    "published_by": found.published_by,
                    "deprecated_at": render::json_time(found.deprecated_at),
                    "retired_at": render::json_time(found.retired_at),
                    "tool_pins": pins
                        .iter()
                        .map(|p| json!({"tool": p.tool, "version": p.version, "pin": p.pin}))
                        .collect::<Vec<_>>(),
                    "manifest": manifest,
                }))
            }
            Output::Text => {
                let mut table = Table::headless(2);
                let mut field = |key: &str, value: String| {
                    table.row(vec![format!("{key}:"), value]);
                };
                field("agent", format!("{agent}@{}", found.version));
                field("status", found.status().to_string());
                field("content_hash", found.content_hash.clone());
                field("published_at", render::time(found.published_at));
                if let Some(by) = &found.published_by {
                    field("published_by", by.clone());
                }
                if let Some(t) = found.deprecated_at {
                    field("deprecated_at", render::time(t));
                }
                if let Some(t) = found.retired_at {
                    field("retired_at", render::time(t));
                }
                for p in &pins {
                    // The table escapes every cell.
                    field("pin", format!("{}@{} {}", p.tool, p.version, p.pin));
                }
                Ok(table.print()?)
            }
        }
    })
}
