//! `phrony bundles versions NS/NAME`: the published versions, newest first, the active one
//! marked.

use std::io::{self, Write};

use phrony_client::{AgentName, BundleVersionSummary, Client, Code};
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles versions`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name.
    bundle: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `VERSION ID LOCK_HASH PUBLISHED_AT PUBLISHED_BY STATUS` (`active` or `published`).
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let bundle = agent_ref::unversioned(&args.bundle, "")?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let versions = client
            .list_bundle_versions(&bundle)
            .await
            .map_err(remote::fails("versions"))?;
        let active = active_version(&client, &bundle).await?;
        let active = active.as_deref();
        match args.output {
            Output::Json => render::json(&Value::Array(
                versions
                    .iter()
                    .map(|v| {
                        json!({
                            "id": v.id,
                            "version": v.version,
                            "lock_hash": v.lock_hash,
                            "published_at": render::time(v.published_at),
                            "published_by": v.published_by,
                            "status": status(v, active),
                        })
                    })
                    .collect(),
            )),
            Output::Text => Ok(write_table(&versions, active, &mut io::stdout().lock())?),
        }
    })
}

/// The version label of the active deployment; `None` when nothing is deployed (the runtime
/// answers `FailedPrecondition`).
async fn active_version(client: &Client, bundle: &AgentName) -> anyhow::Result<Option<String>> {
    match client.active_bundle(bundle).await {
        Ok(active) => Ok(Some(active.version)),
        Err(e) if e.code() == Some(Code::FailedPrecondition) => Ok(None),
        Err(e) => Err(remote::failure("versions", e)),
    }
}

/// `active` for the active deployment's version, else `published`.
fn status(version: &BundleVersionSummary, active: Option<&str>) -> &'static str {
    if active == Some(version.version.as_str()) {
        "active"
    } else {
        "published"
    }
}

/// One row per version, in the runtime's order (newest first); `-` when the publisher is not
/// recorded.
fn write_table(
    versions: &[BundleVersionSummary],
    active: Option<&str>,
    out: &mut impl Write,
) -> io::Result<()> {
    let mut table = Table::new(&[
        "VERSION",
        "ID",
        "LOCK_HASH",
        "PUBLISHED_AT",
        "PUBLISHED_BY",
        "STATUS",
    ]);
    for v in versions {
        table.row(vec![
            v.version.clone(),
            v.id.clone(),
            v.lock_hash.clone(),
            render::time(v.published_at),
            v.published_by.clone().unwrap_or_else(|| "-".to_owned()),
            status(v, active).to_owned(),
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
    fn the_versions_table_marks_the_active_version() {
        let versions = phrony_client::bundle_versions_from_pb(pb::ListBundleVersionsResponse {
            versions: vec![
                pb::BundleVersionSummary {
                    id: "bv-2".into(),
                    version: "1.1.0".into(),
                    published_at: "2025-01-31T09:31:00Z".into(),
                    lock_hash: "sha256:9f8e".into(),
                    published_by: "ci-alice".into(),
                },
                pb::BundleVersionSummary {
                    id: "bv-1".into(),
                    version: "1.0.0".into(),
                    published_at: "2025-01-31T09:30:00Z".into(),
                    lock_hash: "sha256:0a1b".into(),
                    published_by: String::new(),
                },
            ],
        })
        .unwrap();
        let mut out = Vec::new();
        write_table(&versions, Some("1.0.0"), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("bundles_versions_table", text);
        });
        let mut none = Vec::new();
        write_table(&versions, None, &mut none).unwrap();
        assert!(!String::from_utf8(none).unwrap().contains("active"));
    }
}
