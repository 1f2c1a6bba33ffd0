//! `phrony agents ls [-n NAMESPACE]`: the agent catalog.

use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony agents ls`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only agents of this namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ID NAMESPACE NAME OWNER STATUS` (`active` or `archived`), by namespace and name.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let agents = client
            .list_agents(args.namespace.as_deref())
            .await
            .map_err(remote::fails("ls"))?;
        let status = |archived: bool| if archived { "archived" } else { "active" };
        match args.output {
            Output::Json => render::json(&Value::Array(
                agents
                    .iter()
                    .map(|a| {
                        json!({
                            "id": a.id,
                            "namespace": a.agent.namespace,
                            "name": a.agent.name,
                            "owner": a.owner,
                            "status": status(a.archived_at.is_some()),
                            "archived_at": render::json_time(a.archived_at),
                        })
                    })
                    .collect(),
            )),
            Output::Text => {
                let mut table = Table::new(&["ID", "NAMESPACE", "NAME", "OWNER", "STATUS"]);
                for a in agents {
                    let archived = a.archived_at.is_some();
                    table.row(vec![
                        a.id,
                        a.agent.namespace,
                        a.agent.name,
                        if a.owner.is_empty() {
                            "-".to_owned()
                        } else {
                            a.owner
                        },
                        status(archived).to_owned(),
                    ]);
                }
                Ok(table.print()?)
            }
        }
    })
}
