//! `phrony bundles secret-requirements NS/NAME[@VERSION]`: the secrets a bundle version's
//! members declare, the variables `bundles run` reads them from, and who declares each.

use std::io::{self, Write};

use phrony_client::BundleSecretRequirement;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles secret-requirements`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name (the active version) or namespace/name@version (which must be
    /// the active deployment).
    bundle: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `SECRET_NAME FROM_ENV DECLARED_BY`, sorted by secret name.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let parsed = agent_ref::parse(&args.bundle)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let secrets = client
            .bundle_secret_requirements(&parsed.agent, parsed.version.as_deref())
            .await
            .map_err(remote::fails("secret-requirements"))?;
        match args.output {
            Output::Json => render::json(&Value::Array(
                secrets
                    .iter()
                    .map(|s| {
                        json!({
                            "name": s.name,
                            "from_env": s.from_env,
                            "declared_by": s.declared_by,
                        })
                    })
                    .collect(),
            )),
            Output::Text => Ok(write_table(&secrets, &mut io::stdout().lock())?),
        }
    })
}

/// One row per secret; DECLARED_BY lists the member child names, comma-separated.
fn write_table(secrets: &[BundleSecretRequirement], out: &mut impl Write) -> io::Result<()> {
    let mut table = Table::new(&["SECRET_NAME", "FROM_ENV", "DECLARED_BY"]);
    for s in secrets {
        table.row(vec![
            s.name.clone(),
            s.from_env.clone(),
            s.declared_by.join(","),
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
    fn the_table_is_sorted_by_secret_name() {
        let requirement = |from_env: &str, declared_by: &[&str]| pb::SecretRequirement {
            from_env: from_env.into(),
            declared_by: declared_by.iter().map(|s| (*s).to_owned()).collect(),
        };
        let secrets =
            phrony_client::secret_requirements_from_pb(pb::GetBundleSecretRequirementsResponse {
                secrets: [
                    (
                        "openai".to_owned(),
                        requirement("OPENAI_API_KEY", &["refund-specialist", "front-desk"]),
                    ),
                    ("crm".to_owned(), requirement("CRM_TOKEN", &["front-desk"])),
                ]
                .into_iter()
                .collect(),
            });
        let mut out = Vec::new();
        write_table(&secrets, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("bundles_secret_requirements_table", text);
        });
    }
}
