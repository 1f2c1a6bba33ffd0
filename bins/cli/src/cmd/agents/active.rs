//! `phrony agents active NS/NAME`: the active deployment.

use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents active`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent: namespace/name.
    agent: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ns/name@v deployed <time> by <actor>`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let active = client
            .active_version(&agent)
            .await
            .map_err(remote::fails("active"))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": agent.namespace,
                "name": agent.name,
                "version": active.version,
                "deployed_at": render::time(active.deployed_at),
                "actor": active.actor,
            })),
            Output::Text => render::line(format_args!(
                "{agent}@{} deployed {} by {}",
                active.version,
                render::time(active.deployed_at),
                active.actor
            )),
        }
    })
}
