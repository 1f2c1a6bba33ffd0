//! `phrony agents archive NS/NAME`: retire an agent from the catalog for good.

use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents archive`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent: namespace/name.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `archived agent ns/name (all versions deprecated)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "; archive applies to every version")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        client
            .archive(&agent, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "archive",
                "the archive",
                "phrony agents ls".to_owned(),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": agent.namespace,
                "name": agent.name,
                "status": "archived",
            })),
            Output::Text => render::line(format_args!(
                "archived agent {agent} (all versions deprecated)"
            )),
        }
    })
}
