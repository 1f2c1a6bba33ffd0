//! `phrony bundles active NS/NAME`: the active bundle deployment.

use phrony_client::{ActiveBundle, AgentName};
use serde_json::json;

use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles active`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name.
    bundle: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ns/name@v (<lock hash>) deployed <time> by <actor>`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let bundle = agent_ref::unversioned(&args.bundle, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let active = client
            .active_bundle(&bundle)
            .await
            .map_err(remote::fails("active"))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": bundle.namespace,
                "name": bundle.name,
                "version": active.version,
                "lock_hash": active.lock_hash,
                "deployed_at": render::time(active.deployed_at),
                "actor": active.actor,
            })),
            Output::Text => render::line(active_line(&bundle, &active)),
        }
    })
}

/// `ns/name@v (sha256:…) deployed <time> by <actor>`: `agents active`'s line with the lock hash.
fn active_line(bundle: &AgentName, active: &ActiveBundle) -> String {
    format!(
        "{bundle}@{} ({}) deployed {} by {}",
        active.version,
        active.lock_hash,
        render::time(active.deployed_at),
        active.actor
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    #[test]
    fn the_active_line_names_version_lock_hash_time_and_actor() {
        let active = ActiveBundle::try_from(pb::GetActiveBundleResponse {
            version: "1.0.0".into(),
            deployed_at: "2025-01-31T09:30:00Z".into(),
            actor: "ci-alice".into(),
            lock_hash: "sha256:0a1b".into(),
        })
        .unwrap();
        assert_eq!(
            active_line(&AgentName::new("support", "refund-desk"), &active),
            "support/refund-desk@1.0.0 (sha256:0a1b) deployed 2025-01-31T09:30:00Z by ci-alice"
        );
    }
}
