//! `phrony agents retire NS/NAME@VERSION`: stop a version from being deployed or run.

use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents retire`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent and version: namespace/name@version.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `retired ns/name@v (id: <uuid>)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let id = client
            .retire(&agent, &version, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "retire",
                "the retirement",
                format!("phrony agents versions {agent}"),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": agent.namespace,
                "name": agent.name,
                "version": version,
                "version_id": id,
                "status": "retired",
            })),
            Output::Text => render::line(format_args!("retired {agent}@{version} (id: {id})")),
        }
    })
}
