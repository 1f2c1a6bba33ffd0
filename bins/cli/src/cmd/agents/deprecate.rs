//! `phrony agents deprecate NS/NAME@VERSION`: stop a version from running (it stays deployable).

use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents deprecate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent and version: namespace/name@version.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `deprecated ns/name@v (id: <uuid>)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let id = client
            .deprecate(&agent, &version, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "deprecate",
                "the deprecation",
                format!("phrony agents versions {agent}"),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": agent.namespace,
                "name": agent.name,
                "version": version,
                "version_id": id,
                "status": "deprecated",
            })),
            Output::Text => render::line(format_args!("deprecated {agent}@{version} (id: {id})")),
        }
    })
}
