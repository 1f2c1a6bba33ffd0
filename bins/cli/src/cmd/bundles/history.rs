//! `phrony bundles history NS/NAME`: every deploy and rollback of a bundle, newest first.

use std::io::{self, Write};

use phrony_client::DeploymentRecord;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles history`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name.
    bundle: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `VERSION LOCK_HASH ACTION ACTOR CREATED_AT`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let bundle = agent_ref::unversioned(&args.bundle, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let deployments = client
            .list_bundle_deployments(&bundle)
            .await
            .map_err(remote::fails("history"))?;
        match args.output {
            Output::Json => render::json(&Value::Array(
                deployments
                    .iter()
                    .map(|d| {
                        json!({
                            "version": d.version,
                            "lock_hash": d.lock_hash,
                            "action": d.action,
                            "actor": d.actor,
                            "created_at": render::time(d.created_at),
                        })
                    })
                    .collect(),
            )),
            Output::Text => Ok(write_table(&deployments, &mut io::stdout().lock())?),
        }
    })
}

/// One row per deployment, in the runtime's order (newest first).
fn write_table(deployments: &[DeploymentRecord], out: &mut impl Write) -> io::Result<()> {
    let mut table = Table::new(&["VERSION", "LOCK_HASH", "ACTION", "ACTOR", "CREATED_AT"]);
    for d in deployments {
        table.row(vec![
            d.version.clone(),
            d.lock_hash.clone().unwrap_or_else(|| "-".to_owned()),
            d.action.clone(),
            d.actor.clone(),
            render::time(d.created_at),
        ]);
    }
    table.write(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    #[test]
    fn the_history_table_shows_each_rows_lock_hash() {
        let entry =
            |version: &str, lock: &str, action: &str, actor: &str, at: &str| pb::DeploymentEntry {
                version: version.into(),
                action: action.into(),
                actor: actor.into(),
                created_at: at.into(),
                lock_hash: lock.into(),
            };
        let deployments =
            phrony_client::bundle_deployments_from_pb(pb::ListBundleDeploymentsResponse {
                deployments: vec![
                    entry(
                        "1.0.0",
                        "sha256:0a1b",
                        "rollback",
                        "ci-bob",
                        "2025-01-31T09:32:00Z",
                    ),
                    entry(
                        "1.1.0",
                        "sha256:9f8e",
                        "deploy",
                        "ci-alice",
                        "2025-01-31T09:31:00Z",
                    ),
                    entry(
                        "1.0.0",
                        "sha256:0a1b",
                        "deploy",
                        "ci-alice",
                        "2025-01-31T09:30:00Z",
                    ),
                ],
            })
            .unwrap();
        let mut out = Vec::new();
        write_table(&deployments, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("bundles_history_table", text);
        });
    }
}
