//! `phrony agents deploy NS/NAME@VERSION`: activate a published version. A `sha256:` version
//! is a bundle's lock hash: the deployment is forwarded to `DeployBundle` (as
//! `phrony bundles deploy`).

use phrony_client::SecretEndpointChange;
use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, bundles, remote, render};

/// Arguments of `phrony agents deploy`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent and version to activate: namespace/name@version.
    agent: String,
    /// Deploy even though the version sends a secret to an endpoint (model API root, MCP
    /// server) that no earlier deployment of the agent (of the bundle, for a sha256: version)
    /// sent it to; the runtime records the change. Without it such a deploy is refused.
    #[arg(long)]
    allow_new_secret_endpoints: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `deployed ns/name@v (previous: p) at <time>`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (agent, version) = agent_ref::versioned(&args.agent)?;
    if is_lock_hash(&version) {
        return remote::block_on(async {
            let (client, _) = remote::connect(global).await?;
            let deployed =
                bundles::deploy::deploy(&client, &agent, &version, args.allow_new_secret_endpoints)
                    .await?;
            bundles::deploy::print_deployed(&deployed, args.output)
        });
    }
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let deployed = client
            .deploy_with(
                &agent,
                &version,
                &remote::actor(client.sends_credential())?,
                args.allow_new_secret_endpoints,
            )
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
                "secret_endpoint_changes": changes_json(&deployed.secret_endpoint_changes),
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
                ))?;
                print_changes(&deployed.secret_endpoint_changes)
            }
        }
    })
}

/// A bundle version named by its lock hash (`sha256:…`), which `agents deploy` forwards to
/// the bundle deployment.
fn is_lock_hash(version: &str) -> bool {
    version.starts_with("sha256:")
}

/// One line per secret sent to a new endpoint (runtime text, escaped); a bundle's each name
/// the member that sends it.
pub(crate) fn print_changes(changes: &[SecretEndpointChange]) -> anyhow::Result<()> {
    for change in changes {
        render::line(format_args!("{}", render::escape(&change.to_string())))?;
    }
    Ok(())
}

/// `[{secret, from_env, endpoint, previous_endpoints}]`, each with its `member` for a
/// bundle's.
pub(crate) fn changes_json(changes: &[SecretEndpointChange]) -> serde_json::Value {
    changes
        .iter()
        .map(|c| {
            let mut change = json!({
                "secret": c.secret,
                "from_env": c.from_env,
                "endpoint": c.endpoint,
                "previous_endpoints": c.previous_endpoints,
            });
            if let Some(member) = &c.member {
                change["member"] = json!(member);
            }
            change
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sha256_version_is_forwarded_to_the_bundle_deployment() {
        assert!(is_lock_hash("sha256:0a1b"));
        assert!(!is_lock_hash("1.0.0"));
        assert!(!is_lock_hash("1.0.0-sha256"));
    }
}
