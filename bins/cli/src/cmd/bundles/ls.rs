//! `phrony bundles ls [-n NAMESPACE]`: the bundle catalog.

use std::io::{self, Write};

use phrony_client::BundleSummary;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony bundles ls`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only bundles of this namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ID NAMESPACE NAME OWNER`, by namespace and name.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let bundles = client
            .list_bundles(args.namespace.as_deref())
            .await
            .map_err(remote::fails("ls"))?;
        match args.output {
            Output::Json => render::json(&Value::Array(
                bundles
                    .iter()
                    .map(|b| {
                        json!({
                            "id": b.id,
                            "namespace": b.bundle.namespace,
                            "name": b.bundle.name,
                            "owner": b.owner,
                        })
                    })
                    .collect(),
            )),
            Output::Text => Ok(write_table(&bundles, &mut io::stdout().lock())?),
        }
    })
}

/// One row per bundle; `-` for a bundle without an owner.
fn write_table(bundles: &[BundleSummary], out: &mut impl Write) -> io::Result<()> {
    let mut table = Table::new(&["ID", "NAMESPACE", "NAME", "OWNER"]);
    for b in bundles {
        table.row(vec![
            b.id.clone(),
            b.bundle.namespace.clone(),
            b.bundle.name.clone(),
            b.owner.clone().unwrap_or_else(|| "-".to_owned()),
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
    fn the_ls_table_lists_id_namespace_name_and_owner() {
        let bundles = phrony_client::bundles_from_pb(pb::ListBundlesResponse {
            bundles: vec![
                pb::BundleSummary {
                    id: "6f1c0a52-2a55-4d3c-9d36-0c1e6f1c9a10".into(),
                    namespace: "support".into(),
                    name: "refund-desk".into(),
                    owner: "platform-team".into(),
                },
                pb::BundleSummary {
                    id: "7a2d1b63-3b66-4e4d-8e47-1d2f7a2dab21".into(),
                    namespace: "support".into(),
                    name: "triage".into(),
                    owner: String::new(),
                },
            ],
        });
        let mut out = Vec::new();
        write_table(&bundles, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("bundles_ls_table", text);
        });
    }
}
