//! Structured logs on stderr via tracing-subscriber.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, Settings};

/// Installs the global subscriber: `RUNTIME_LOG` (or `--log`), else `RUST_LOG`, else `info`.
pub fn init(settings: &Settings) -> anyhow::Result<()> {
    let (source, directives) = match settings
        .log_filter
        .as_deref()
        .filter(|f| !f.trim().is_empty())
    {
        Some(f) => ("RUNTIME_LOG", f.to_owned()),
        None => match std::env::var("RUST_LOG") {
            Ok(f) if !f.trim().is_empty() => ("RUST_LOG", f),
            _ => ("default", "info".to_owned()),
        },
    };
    let filter = EnvFilter::builder()
        .parse(&directives)
        .with_context(|| format!("invalid {source} log filter {directives:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_target(false);
    let installed = match settings.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
