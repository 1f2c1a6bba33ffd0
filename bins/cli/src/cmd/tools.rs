//! `phrony tools pin FILE…`: the descriptor pin of Tool documents, for workers to advertise.
//!
//! The pin (`phrony_manifest::tool_descriptor_pin`) is the hash of the tool's name, version,
//! description and input schema; a worker passes it as the handler's `descriptor_hash` and the
//! runtime refuses a registration whose hash matches no pin of a published agent version.

use std::path::PathBuf;

use serde_json::json;

use crate::cmd::{Output, manifest, render};

/// `phrony tools …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Print the descriptor pin of Tool documents (`tool@version sha256:…`), the
    /// `descriptor_hash` a worker serving them advertises.
    Pin(PinArgs),
}

/// Arguments of `phrony tools pin`.
#[derive(Debug, clap::Args)]
pub(crate) struct PinArgs {
    /// Tool documents (tools/*.yaml); schema refs resolve from the parent of `tools/`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Pin(args) => pin(&args),
        }
    }
}

/// Prints one `tool@version pin` line per file (or a JSON array); the first file that is not a
/// valid Tool document stops it with its diagnostics.
fn pin(args: &PinArgs) -> anyhow::Result<()> {
    let mut pins = Vec::with_capacity(args.files.len());
    for file in &args.files {
        match phrony_manifest::tool_descriptor_pin(file) {
            Ok(pin) => pins.push((file, pin)),
            Err(diags) => return Err(manifest::rejected(&diags, "Tool document")),
        }
    }
    match args.output {
        Output::Json => render::json(&json!(
            pins.iter()
                .map(|(file, p)| json!({
                    "file": file.display().to_string(),
                    "tool": p.tool,
                    "version": p.version,
                    "pin": p.pin,
                }))
                .collect::<Vec<_>>()
        )),
        Output::Text => {
            for (_, p) in &pins {
                render::line(format_args!(
                    "{}@{} {}",
                    render::escape(&p.tool),
                    render::escape(&p.version),
                    p.pin
                ))?;
            }
            Ok(())
        }
    }
}
