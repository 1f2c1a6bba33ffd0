//! `phrony schema`: print the JSON Schema of the authoring format.
//!
//! Editors with the YAML language server can use it from a local path:
//! `phrony schema > agent-spec.v1.json`, then `# yaml-language-server: $schema=./agent-spec.v1.json`.

use std::io::{self, Write as _};

/// The authoring JSON Schema (draft-07) of Agent, Tool, Policy and Bundle documents.
pub(crate) const AGENT_SPEC_V1: &str = include_str!("../../schema/agent-spec.v1.json");

/// Arguments of `phrony schema`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// Prints the schema on stdout.
pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    io::stdout().lock().write_all(AGENT_SPEC_V1.as_bytes())?;
    Ok(())
}
