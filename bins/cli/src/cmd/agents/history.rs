//! `phrony agents history NS/NAME`: every deploy and rollback, newest first.

use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents history`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent: namespace/name.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `VERSION ACTION ACTOR CREATED_AT`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let deployments = client
            .list_deployments(&agent)
            .await
            .map_err(remote::fails("history"))?;
        match args.output {
            Output::Json => render::json(&Value::Array(
                deployments
                    .iter()
                    .map(|d| {
                        json!({
                            "version": d.version,
                            "action": d.action,
                            "actor": d.actor,
                            "created_at": render::time(d.created_at),
                        })
                    })
                    .collect(),
            )),
            Output::Text => {
                let mut table = Table::new(&["VERSION", "ACTION", "ACTOR", "CREATED_AT"]);
                for d in deployments {
                    table.row(vec![
                        d.version,
                        d.action,
                        d.actor,
                        render::time(d.created_at),
                    ]);
                }
                Ok(table.print()?)
            }
        }
    })
}
