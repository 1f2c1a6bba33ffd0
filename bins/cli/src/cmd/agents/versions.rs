//! `phrony agents versions NS/NAME`: the published versions, newest first.

use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents versions`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent: namespace/name.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `VERSION ID CONTENT_HASH PUBLISHED_AT STATUS`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let versions = client
            .list_agent_versions(&agent)
            .await
            .map_err(remote::fails("versions"))?;
        match args.output {
            Output::Json => render::json(&Value::Array(
                versions
                    .iter()
                    .map(|v| {
                        json!({
                            "id": v.id,
                            "version": v.version,
                            "content_hash": v.content_hash,
                            "published_at": render::time(v.published_at),
                            "published_by": v.published_by,
                            "deprecated_at": render::json_time(v.deprecated_at),
                            "retired_at": render::json_time(v.retired_at),
                            "status": v.status().as_str(),
                        })
                    })
                    .collect(),
            )),
            Output::Text => {
                let mut table =
                    Table::new(&["VERSION", "ID", "CONTENT_HASH", "PUBLISHED_AT", "STATUS"]);
                for v in versions {
                    table.row(vec![
                        v.version.clone(),
                        v.id.clone(),
                        v.content_hash.clone(),
                        render::time(v.published_at),
                        v.status().to_string(),
                    ]);
                }
                Ok(table.print()?)
            }
        }
    })
}
