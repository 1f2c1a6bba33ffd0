//! `phrony bundles deploy NS/NAME@VERSION`: activate a published bundle version (its semver
//! label or its `sha256:` lock hash). `phrony agents deploy NS/NAME@sha256:…` comes here too.

use phrony_client::{AgentName, Client, DeployedBundle};
use serde_json::json;

use crate::cmd::agents::deploy::{changes_json, print_changes};
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles deploy`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle and version to activate: namespace/name@version (semver or sha256: lock hash).
    bundle: String,
    /// Deploy even though a member of the version sends a secret to an endpoint (model API
    /// root, MCP server) that no earlier deployment of the bundle sent it to; the runtime
    /// records the change. Without it such a deploy is refused.
    #[arg(long)]
    allow_new_secret_endpoints: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `deployed ns/name@v (<lock hash>) (previous: p) at <time>`, then each allowed
/// secret endpoint change.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (bundle, version) = agent_ref::versioned(&args.bundle)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let deployed = deploy(&client, &bundle, &version, args.allow_new_secret_endpoints).await?;
        print_deployed(&deployed, args.output)
    })
}

/// `DeployBundle`, its failure rendered for the user.
pub(crate) async fn deploy(
    client: &Client,
    bundle: &AgentName,
    version: &str,
    allow_new_secret_endpoints: bool,
) -> anyhow::Result<DeployedBundle> {
    client
        .deploy_bundle(
            bundle,
            version,
            &remote::actor(client.sends_credential())?,
            allow_new_secret_endpoints,
        )
        .await
        .map_err(remote::change_fails(
            "deploy",
            "the deployment",
            format!("phrony bundles active {bundle}"),
        ))
}

/// Prints a bundle deployment as text (its line, then one per allowed change) or JSON.
pub(crate) fn print_deployed(deployed: &DeployedBundle, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => render::json(&deployed_json(deployed)),
        Output::Text => {
            render::line(deployed_line(deployed))?;
            print_changes(&deployed.secret_endpoint_changes)
        }
    }
}

/// `deployed ns/name@v (sha256:…) (previous: p) at <time>`; no `(previous: …)` on the first
/// deployment.
fn deployed_line(deployed: &DeployedBundle) -> String {
    let previous = deployed
        .previous_version
        .as_ref()
        .map(|p| format!(" (previous: {p})"))
        .unwrap_or_default();
    format!(
        "deployed {}@{} ({}){previous} at {}",
        deployed.bundle,
        deployed.version,
        deployed.lock_hash,
        render::time(deployed.deployed_at)
    )
}

fn deployed_json(deployed: &DeployedBundle) -> serde_json::Value {
    json!({
        "namespace": deployed.bundle.namespace,
        "name": deployed.bundle.name,
        "version": deployed.version,
        "lock_hash": deployed.lock_hash,
        "previous_version": deployed.previous_version,
        "previous_lock_hash": deployed.previous_lock_hash,
        "deployed_at": render::time(deployed.deployed_at),
        "secret_endpoint_changes": changes_json(&deployed.secret_endpoint_changes),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    fn response(previous: &str, previous_lock: &str) -> DeployedBundle {
        DeployedBundle::try_from(pb::DeployBundleResponse {
            namespace: "support".into(),
            name: "refund-desk".into(),
            version: "1.1.0".into(),
            previous_version: previous.into(),
            deployed_at: "2025-01-31T09:30:00.123456Z".into(),
            lock_hash: "sha256:0a1b".into(),
            previous_lock_hash: previous_lock.into(),
            secret_endpoint_changes: vec![pb::SecretEndpointChange {
                secret: "openai".into(),
                from_env: "OPENAI_API_KEY".into(),
                endpoint: "http://b.example/v1".into(),
                previous_endpoints: vec!["http://a.example/v1".into()],
                member: "front-desk".into(),
            }],
        })
        .unwrap()
    }

    #[test]
    fn the_deployed_line_names_the_lock_hash_and_the_previous_version() {
        assert_eq!(
            deployed_line(&response("1.0.0", "sha256:9f8e")),
            "deployed support/refund-desk@1.1.0 (sha256:0a1b) (previous: 1.0.0) at \
             2025-01-31T09:30:00Z"
        );
        assert_eq!(
            deployed_line(&response("", "")),
            "deployed support/refund-desk@1.1.0 (sha256:0a1b) at 2025-01-31T09:30:00Z"
        );
        let first = deployed_json(&response("", ""));
        assert_eq!(first["previous_version"], serde_json::Value::Null);
        assert_eq!(first["lock_hash"], "sha256:0a1b");
        assert_eq!(
            deployed_json(&response("1.0.0", "sha256:9f8e"))["previous_lock_hash"],
            "sha256:9f8e"
        );
        assert_eq!(
            first["secret_endpoint_changes"],
            serde_json::json!([{
                "member": "front-desk",
                "secret": "openai",
                "from_env": "OPENAI_API_KEY",
                "endpoint": "http://b.example/v1",
                "previous_endpoints": ["http://a.example/v1"],
            }])
        );
        assert_eq!(
            response("", "").secret_endpoint_changes[0].to_string(),
            "member \"front-desk\": secret \"openai\" (OPENAI_API_KEY) is now sent to \
             http://b.example/v1 (previous deployments: http://a.example/v1)"
        );
    }
}
