//! `phrony agents deploy NS/NAME@VERSION`: activate a published version.

use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents deploy`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent and version to activate: namespace/name@version.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `deployed ns/name@v (previous: p) at <time>`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let deployed = client
            .deploy(&agent, &version, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "deploy",
                "the deployment",
                format!("phrony agents active {agent}"),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": deployed.agent.namespace,
                "name": deployed.agent.name,
                "version": deployed.version,
                "previous_version": deployed.previous_version,
                "deployed_at": render::time(deployed.deployed_at),
            })),
            Output::Text => {
                let previous = deployed
                    .previous_version
                    .as_ref()
                    .map(|p| format!(" (previous: {p})"))
                    .unwrap_or_default();
                render::line(format_args!(
                    "deployed {}@{}{previous} at {}",
                    deployed.agent,
                    deployed.version,
                    render::time(deployed.deployed_at)
                ))
            }
        }
    })
}
