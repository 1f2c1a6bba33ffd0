//! `phrony agents rollback NS/NAME [--to VERSION]`: re-activate the previous or a named version.

use serde_json::json;

use super::deploy;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony agents rollback`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent: namespace/name.
    agent: String,
    /// The version to re-activate (default: the version deployed before the active one).
    #[arg(long, value_name = "VERSION")]
    to: Option<String>,
    /// Roll back even though the `--to` version (never deployed before) sends a secret to an
    /// endpoint no earlier deployment of the agent sent it to; the runtime records the change.
    #[arg(long)]
    allow_new_secret_endpoints: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `rolled back ns/name to V (was: P)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "; use --to VERSION to pick the version")?;
    if args.to.as_deref().is_some_and(|v| v.trim().is_empty()) {
        anyhow::bail!("--to must not be empty");
    }
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let rolled = client
            .rollback_with(
                &agent,
                args.to.as_deref(),
                &remote::actor(client.sends_credential())?,
                args.allow_new_secret_endpoints,
            )
            .await
            .map_err(remote::change_fails(
                "rollback",
                "the rollback",
                format!("phrony agents active {agent}"),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": agent.namespace,
                "name": agent.name,
                "version": rolled.version,
                "previous_version": rolled.previous_version,
                "secret_endpoint_changes": deploy::changes_json(&rolled.secret_endpoint_changes),
            })),
            Output::Text => {
                let was = rolled
                    .previous_version
                    .as_ref()
                    .map(|p| format!(" (was: {p})"))
                    .unwrap_or_default();
                render::line(format_args!(
                    "rolled back {agent} to {}{was}",
                    rolled.version
                ))?;
                deploy::print_changes(&rolled.secret_endpoint_changes)
            }
        }
    })
}
