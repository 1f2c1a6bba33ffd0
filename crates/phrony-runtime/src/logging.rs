//! Structured logs on stderr via tracing-subscriber, and the trace export (`telemetry.rs`)
//! as a second layer of the same subscriber.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use tracing::Metadata;
use tracing_subscriber::filter::{EnvFilter, FilterExt as _, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, fmt};

use crate::config::{LogFormat, Settings};
use crate::telemetry::{RPC_TARGET, TRACE_TARGET, Telemetry, TraceConfig};

/// Installs the global subscriber: logs filtered by `RUNTIME_LOG` (or `--log`), else
/// `RUST_LOG`, else `info`; and, when the `OTEL_*` variables configure it, the trace export
/// (independent of the log filter). Logs whether traces are exported. Keep the returned
/// [`Telemetry`] and shut it down when the process ends.
///
/// # Errors
/// A log filter that does not parse, an `OTEL_*` value that cannot be honoured, or a logger
/// already installed.
pub fn init(settings: &Settings) -> anyhow::Result<Telemetry> {
    init_with(settings, |name| std::env::var(name).ok())
}

/// [`init`] with the environment read through `var`.
///
/// # Errors
/// As [`init`].
pub fn init_with(
    settings: &Settings,
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Telemetry> {
    let (source, directives) = match settings
        .log_filter
        .as_deref()
        .filter(|f| !f.trim().is_empty())
    {
        Some(f) => ("RUNTIME_LOG", f.to_owned()),
        None => match var("RUST_LOG") {
            Some(f) if !f.trim().is_empty() => ("RUST_LOG", f),
            _ => ("default", "info".to_owned()),
        },
    };
    let filter = EnvFilter::builder()
        .parse(&directives)
        .with_context(|| format!("invalid {source} log filter {directives:?}"))?;
    let telemetry = Telemetry::start(TraceConfig::from_env(&var)?)?;
    let ansi = std::io::stderr().is_terminal() && var("NO_COLOR").is_none();
    let logs = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    let logs = match settings.log_format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .boxed(),
    }
    // The engine's trace spans are for the exporter: log lines stay as they were.
    .with_filter(filter.and(filter_fn(|m| !is_trace_span(m))));
    let traces = telemetry.tracer().map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(filter_fn(is_exported))
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))?;
    telemetry.log_state();
    Ok(telemetry)
}

/// One of the engine's spans (`phrony.session`, `phrony.turn`, …).
fn is_trace_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target() == TRACE_TARGET
}

/// What the exporter sees: the engine's spans and the gRPC server's `rpc` spans; no events (log
/// lines may quote errors with arguments in them).
fn is_exported(meta: &Metadata<'_>) -> bool {
    is_trace_span(meta) || (meta.is_span() && meta.target() == RPC_TARGET)
}
