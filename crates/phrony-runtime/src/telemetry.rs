//! Trace export (issue #19): the engine's spans and the gRPC server's `rpc` spans, sent over
//! OTLP/gRPC when the standard `OTEL_*` variables configure an endpoint, and nothing at all
//! otherwise.
//!
//! - On when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (an
//!   `http://` URL), unless `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`.
//! - The batch span processor runs on its own thread with a bounded queue
//!   (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048): a full queue drops spans, it never blocks a
//!   session; the exporter's own Tokio runtime (one thread) carries its gRPC connection, so an
//!   exporter that is slow or down never holds the daemon's runtime.
//! - `service.name` is `OTEL_SERVICE_NAME`, else `phrony-runtime`.
//! - W3C trace context: a client's `traceparent` on any RPC becomes the parent of its `rpc`
//!   span ([`rpc_span`]), and the engine hands its dispatch span's context to workers.
//! - [`Telemetry::shutdown`] flushes within [`FLUSH_TIMEOUT`].

use std::time::Duration;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The span target the engine's spans use (`phrony.session`, `phrony.turn`, …).
pub use phrony_engine::TRACE_TARGET;

/// The target of the gRPC server's `rpc` spans (exported with the engine's).
pub const RPC_TARGET: &str = "phrony_runtime::rpc";

/// `service.name` when `OTEL_SERVICE_NAME` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "phrony-runtime";

/// How long the shutdown waits for the last spans to be exported.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// A trace-export setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A variable has a value we do not accept.
    #[error("invalid {var}={value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// The OTLP exporter could not be built from the configuration.
    #[error("cannot build the OTLP trace exporter for {endpoint}: {message}")]
    Exporter {
        /// The configured endpoint.
        endpoint: String,
        /// The exporter's error.
        message: String,
    },
    /// The exporter's runtime could not be started.
    #[error("cannot start the trace exporter's runtime: {0}")]
    Runtime(std::io::Error),
}

/// Where traces go, as read from the environment: `None` from [`TraceConfig::from_env`] when
/// export is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// The OTLP/gRPC endpoint (`http://host:port`).
    pub endpoint: String,
    /// The variable the endpoint came from.
    pub endpoint_var: &'static str,
    /// `service.name`.
    pub service_name: String,
}

const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";

impl TraceConfig {
    /// Reads the `OTEL_*` variables through `var` (empty values count as unset).
    ///
    /// # Errors
    /// [`TelemetryError::Invalid`] for a value we cannot honour: `OTEL_SDK_DISABLED` other
    /// than `true`/`false`, `OTEL_TRACES_EXPORTER` other than `otlp`/`none`, a protocol other
    /// than `grpc`, an endpoint that is not an `http://` URL.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TelemetryError> {
        let get = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if let Some(value) = get(SDK_DISABLED) {
            match value.to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                _ => return Err(invalid(SDK_DISABLED, value, "expected true or false")),
            }
        }
        if let Some(value) = get(TRACES_EXPORTER) {
            match value.as_str() {
                "none" => return Ok(None),
                "otlp" => {}
                _ => {
                    return Err(invalid(
                        TRACES_EXPORTER,
                        value,
                        "the runtime exports traces with otlp only (or none)",
                    ));
                }
            }
        }
        let Some((endpoint_var, endpoint)) = get(TRACES_ENDPOINT)
            .map(|e| (TRACES_ENDPOINT, e))
            .or_else(|| get(ENDPOINT).map(|e| (ENDPOINT, e)))
        else {
            return Ok(None);
        };
        for protocol_var in [TRACES_PROTOCOL, PROTOCOL] {
            if let Some(value) = get(protocol_var)
                && value != "grpc"
            {
                return Err(invalid(
                    protocol_var,
                    value,
                    "the runtime speaks OTLP over gRPC only: set grpc or leave it unset",
                ));
            }
        }
        match url::Url::parse(&endpoint) {
            Ok(url) if url.scheme() == "http" && url.host_str().is_some() => {}
            Ok(url) if url.scheme() == "https" => {
                return Err(invalid(
                    endpoint_var,
                    endpoint,
                    "https endpoints are not supported yet: send to a collector on a trusted \
                     network (e.g. a local agent) over http://",
                ));
            }
            _ => {
                return Err(invalid(
                    endpoint_var,
                    endpoint,
                    "expected an OTLP/gRPC URL such as http://127.0.0.1:4317",
                ));
            }
        }
        Ok(Some(Self {
            endpoint,
            endpoint_var,
            service_name: get(SERVICE_NAME).unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
        }))
    }
}

fn invalid(var: &'static str, value: String, reason: &'static str) -> TelemetryError {
    TelemetryError::Invalid { var, value, reason }
}

/// The running trace export (or none). Keep it until the process ends, then call
/// [`Telemetry::shutdown`].
#[derive(Debug, Default)]
pub struct Telemetry {
    export: Option<Export>,
}

#[derive(Debug)]
struct Export {
    provider: SdkTracerProvider,
    /// Carries the exporter's gRPC connection (off the daemon's runtime).
    runtime: tokio::runtime::Runtime,
    config: TraceConfig,
}

impl Telemetry {
    /// Builds the exporter and the tracer provider for `config` (nothing for `None`) and installs
    /// the W3C trace-context propagator. Connects lazily: an unreachable collector is no error.
    ///
    /// # Errors
    /// [`TelemetryError::Exporter`] or [`TelemetryError::Runtime`].
    pub fn start(config: Option<TraceConfig>) -> Result<Self, TelemetryError> {
        let Some(config) = config else {
            return Ok(Self::default());
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otel-export")
            .enable_all()
            .build()
            .map_err(TelemetryError::Runtime)?;
        let exporter = {
            let _entered = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .build()
                .map_err(|e| TelemetryError::Exporter {
                    endpoint: config.endpoint.clone(),
                    message: e.to_string(),
                })?
        };
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        Ok(Self {
            export: Some(Export {
                provider,
                runtime,
                config,
            }),
        })
    }

    /// The tracer the `tracing` layer exports through, when export is on.
    #[must_use]
    pub fn tracer(&self) -> Option<SdkTracer> {
        self.export
            .as_ref()
            .map(|e| e.provider.tracer(DEFAULT_SERVICE_NAME))
    }

    /// Logs (once, at start) whether traces are exported and where.
    pub fn log_state(&self) {
        match &self.export {
            Some(e) => tracing::info!(
                endpoint = %e.config.endpoint,
                service_name = %e.config.service_name,
                "trace export on: OTLP/gRPC to {} (from {})",
                e.config.endpoint,
                e.config.endpoint_var
            ),
            None => tracing::info!(
                "trace export off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces over OTLP)"
            ),
        }
    }

    /// Exports the spans still queued, waiting at most [`FLUSH_TIMEOUT`], then stops the
    /// exporter (what it could not send by then is dropped).
    pub fn shutdown(self) {
        let Some(export) = self.export else {
            return;
        };
        if let Err(e) = export.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!(error = %e, "trace export did not finish at shutdown");
        }
        export.runtime.shutdown_timeout(Duration::from_millis(200));
    }
}

/// The server span of one RPC (tonic's `trace_fn`): a child of the caller's W3C
/// `traceparent` (and `tracestate`) when the request carries a valid one.
pub fn rpc_span(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    let span = tracing::info_span!(
        target: RPC_TARGET,
        "rpc",
        method = %request.uri().path(),
        otel.kind = "server"
    );
    if span.is_disabled() {
        return span;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(request.headers()))
    });
    if parent.span().span_context().is_valid() {
        // Only fails once the span was entered, which it was not yet.
        let _ = span.set_parent(parent);
    }
    span
}

/// Reads W3C trace-context headers from a request's metadata.
struct HeaderExtractor<'a>(&'a tonic::codegen::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(tonic::codegen::http::HeaderName::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Option<TraceConfig>, TelemetryError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TraceConfig::from_env(|name| vars.get(name).cloned())
    }

    fn error(vars: &[(&str, &str)]) -> String {
        match config(vars) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("expected an error for {vars:?}, got {c:?}"),
        }
    }

    #[test]
    fn no_variable_builds_no_exporter() {
        assert_eq!(config(&[]).ok(), Some(None));
        assert_eq!(config(&[(ENDPOINT, "  ")]).ok(), Some(None));
        // Variables that only tune an exporter do not turn one on.
        assert_eq!(
            config(&[(SERVICE_NAME, "x"), (PROTOCOL, "grpc")]).ok(),
            Some(None)
        );
        let telemetry = Telemetry::start(None).ok();
        assert!(telemetry.is_some_and(|t| t.tracer().is_none()));
    }

    #[test]
    fn an_endpoint_turns_export_on_with_the_default_service_name() {
        let c = config(&[(ENDPOINT, "http://127.0.0.1:4317")])
            .ok()
            .flatten();
        assert_eq!(
            c,
            Some(TraceConfig {
                endpoint: "http://127.0.0.1:4317".to_owned(),
                endpoint_var: ENDPOINT,
                service_name: "phrony-runtime".to_owned(),
            })
        );
    }

    #[test]
    fn the_traces_endpoint_wins_and_the_service_name_is_read() {
        let c = config(&[
            (ENDPOINT, "http://a:4317"),
            (TRACES_ENDPOINT, "http://b:4317"),
            (SERVICE_NAME, "payments-runtime"),
            (TRACES_PROTOCOL, "grpc"),
        ])
        .ok()
        .flatten();
        let c = c.unwrap_or_else(|| panic!("export should be on"));
        assert_eq!(c.endpoint, "http://b:4317");
        assert_eq!(c.endpoint_var, TRACES_ENDPOINT);
        assert_eq!(c.service_name, "payments-runtime");
    }

    #[test]
    fn none_and_disabled_turn_export_off() {
        let on = [(ENDPOINT, "http://127.0.0.1:4317")];
        assert_eq!(config(&[on[0], (TRACES_EXPORTER, "none")]).ok(), Some(None));
        assert_eq!(config(&[on[0], (SDK_DISABLED, "TRUE")]).ok(), Some(None));
        assert!(
            config(&[on[0], (SDK_DISABLED, "false"), (TRACES_EXPORTER, "otlp")])
                .ok()
                .flatten()
                .is_some()
        );
    }

    #[test]
    fn bad_values_are_named_in_the_error() {
        let on = (ENDPOINT, "http://127.0.0.1:4317");
        let e = error(&[on, (SDK_DISABLED, "yes")]);
        assert!(e.contains("OTEL_SDK_DISABLED=\"yes\""), "{e}");
        let e = error(&[on, (TRACES_EXPORTER, "jaeger")]);
        assert!(e.contains("OTEL_TRACES_EXPORTER=\"jaeger\""), "{e}");
        let e = error(&[on, (PROTOCOL, "http/protobuf")]);
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("gRPC only"),
            "{e}"
        );
        let e = error(&[(ENDPOINT, "127.0.0.1:4317")]);
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_ENDPOINT=\"127.0.0.1:4317\""),
            "{e}"
        );
        let e = error(&[(TRACES_ENDPOINT, "https://collector:4317")]);
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && e.contains("https"),
            "{e}"
        );
        let e = error(&[(ENDPOINT, "ftp://collector")]);
        assert!(e.contains("expected an OTLP/gRPC URL"), "{e}");
    }
}
