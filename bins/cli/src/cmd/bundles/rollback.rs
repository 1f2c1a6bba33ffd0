//! `phrony bundles rollback NS/NAME [--to VERSION]`: re-activate the previous or a named bundle
//! version (`RollbackBundle`, a phrony-rs addition).

use phrony_client::{AgentName, RolledBackBundle};
use serde_json::json;

use crate::cmd::agents::deploy::{changes_json, print_changes};
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles rollback`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name.
    bundle: String,
    /// The version (semver or sha256: lock hash) to re-activate (default: the version deployed
    /// before the active one).
    #[arg(long, value_name = "VERSION")]
    to: Option<String>,
    /// Roll back even though a member of the `--to` version (never deployed before) sends a
    /// secret to an endpoint no earlier deployment of the bundle sent it to; the runtime records
    /// the change.
    #[arg(long)]
    allow_new_secret_endpoints: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `rolled back ns/name to V (was: P)`, then each allowed secret endpoint change.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let bundle = agent_ref::unversioned(&args.bundle, "; use --to VERSION to pick the version")?;
    if args.to.as_deref().is_some_and(|v| v.trim().is_empty()) {
        anyhow::bail!("--to must not be empty");
    }
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let rolled = client
            .rollback_bundle(
                &bundle,
                args.to.as_deref(),
                &remote::actor(client.sends_credential())?,
                args.allow_new_secret_endpoints,
            )
            .await
            .map_err(remote::change_fails(
                "rollback",
                "the rollback",
                format!("phrony bundles active {bundle}"),
            ))?;
        match args.output {
            Output::Json => render::json(&rolled_json(&bundle, &rolled)),
            Output::Text => {
                render::line(rolled_line(&bundle, &rolled))?;
                print_changes(&rolled.secret_endpoint_changes)
            }
        }
    })
}

/// `rolled back ns/name to V (was: P)`, as `agents rollback` prints it.
fn rolled_line(bundle: &AgentName, rolled: &RolledBackBundle) -> String {
    let was = rolled
        .previous_version
        .as_ref()
        .map(|p| format!(" (was: {p})"))
        .unwrap_or_default();
    format!("rolled back {bundle} to {}{was}", rolled.version)
}

fn rolled_json(bundle: &AgentName, rolled: &RolledBackBundle) -> serde_json::Value {
    json!({
        "namespace": bundle.namespace,
        "name": bundle.name,
        "version": rolled.version,
        "lock_hash": rolled.lock_hash,
        "previous_version": rolled.previous_version,
        "previous_lock_hash": rolled.previous_lock_hash,
        "deployed_at": render::json_time(rolled.deployed_at),
        "secret_endpoint_changes": changes_json(&rolled.secret_endpoint_changes),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    #[test]
    fn the_rolled_back_line_reads_like_the_agents_one() {
        let rolled = RolledBackBundle::try_from(pb::RollbackBundleResponse {
            version: "1.0.0".into(),
            previous_version: "1.1.0".into(),
            lock_hash: "sha256:0a1b".into(),
            previous_lock_hash: "sha256:9f8e".into(),
            deployed_at: "2025-01-31T09:30:00Z".into(),
            secret_endpoint_changes: Vec::new(),
        })
        .unwrap();
        let bundle = AgentName::new("support", "refund-desk");
        assert_eq!(
            rolled_line(&bundle, &rolled),
            "rolled back support/refund-desk to 1.0.0 (was: 1.1.0)"
        );
        let shown = rolled_json(&bundle, &rolled);
        assert_eq!(shown["lock_hash"], "sha256:0a1b");
        assert_eq!(shown["deployed_at"], "2025-01-31T09:30:00Z");
        assert_eq!(shown["secret_endpoint_changes"], serde_json::json!([]));
    }
}
