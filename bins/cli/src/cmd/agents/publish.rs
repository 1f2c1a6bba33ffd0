//! `phrony agents publish MANIFEST`: compile locally, publish an immutable version.

use std::path::PathBuf;

use serde_json::json;

use crate::cmd::{Global, Output, manifest, remote, render};

/// Arguments of `phrony agents publish`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Agent manifest (agent.yaml).
    manifest: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Compiles the manifest (failing before any network call when it is invalid), publishes the
/// snapshot and prints `ns/name <version>`; an identical re-publish says so and succeeds.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = manifest::load_agent(&args.manifest)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let published = client
            .publish(&agent, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "publish",
                "the version",
                format!(
                    "phrony agents versions {}/{}",
                    agent.metadata.namespace, agent.metadata.name
                ),
            ))?;
        match args.output {
            Output::Json => render::json(&json!({
                "namespace": published.agent.namespace,
                "name": published.agent.name,
                "version": published.version,
                "agent_id": published.agent_id,
                "version_id": published.version_id,
                "content_hash": published.content_hash,
                "created": published.created,
            })),
            Output::Text if published.created => {
                render::line(format_args!("{} {}", published.agent, published.version))
            }
            Output::Text => render::line(format_args!(
                "{} {} (unchanged, already published)",
                published.agent, published.version
            )),
        }
    })
}
