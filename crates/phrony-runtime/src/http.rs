//! The daemon's HTTP listener (`RUNTIME_HTTP_ADDR`, off when unset): liveness and readiness
//! probes, the Prometheus metrics and the approvals console ([`crate::console`], under
//! `/console/`), on the daemon's tokio runtime (axum).
//!
//! - `GET /healthz`: `200 ok` while the process serves HTTP (from before the database is
//!   reached until shutdown). Unauthenticated.
//! - `GET /readyz`: `200 ready` only while the daemon is `SERVING`: start-up recovery is done
//!   and the database takes writes (the gRPC health state, [`phrony_grpc::health::Health`]);
//!   else `503` with the reason. Unauthenticated.
//! - `GET /metrics`: the Prometheus exposition (OpenMetrics text, `prometheus-client`'s
//!   encoder) of the `phrony_metrics` catalog plus the gauges read at scrape time (sessions by
//!   status and pending approvals from the ledger, queue depth and workers per tool from the
//!   router). In `required` auth mode the bearer token is authenticated exactly as a gRPC call's
//!   (the same authenticator) and needs the `read` permission: `401` without or with a bad
//!   credential, `403` without `read`. Reads are not audited. Before the daemon serves it answers
//!   `503` (the ledger and the authenticator are not there yet).
//!
//! The listener speaks plain HTTP (no TLS, so no client certificates): in `local` auth mode it
//! must bind a loopback address ([`HttpServer::start`] refuses any other), as the gRPC listener
//! must; in `required` mode it may bind any address because `/metrics` and the console then
//! need a token and the probes reveal nothing but up/ready.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use phrony_auth::{AuthError, Authenticator, Credentials, Permission};
use phrony_dispatch::Router;
use phrony_grpc::health::Health;
use phrony_ledger::{Ledger, MetricCounts, SessionStatus};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::auth::AuthMode;
use crate::serve::ServeError;

/// The `Content-Type` of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the HTTP routes read once the daemon serves: set by [`crate::serve`] after start-up
/// recovery.
#[derive(Clone)]
pub(crate) struct Serving {
    pub(crate) health: Health,
    pub(crate) ledger: Ledger,
    pub(crate) router: Router,
    pub(crate) authenticator: Arc<dyn Authenticator>,
    /// The gRPC service, called in process by the console (`crate::console`).
    pub(crate) service: phrony_grpc::RuntimeService,
}

/// The listener's state, shared by its routes and the console's.
pub(crate) struct Shared {
    pub(crate) mode: AuthMode,
    pub(crate) serving: OnceLock<Serving>,
    /// The console's signed-in sessions.
    pub(crate) console: crate::console::Sessions,
    /// The console's failed sign-ins, per client address and per credential.
    pub(crate) login_throttle: phrony_auth::LoginThrottle,
}

/// The handle [`crate::serve`] uses to mark the daemon ready (see [`ServeConfig::http`]).
///
/// [`ServeConfig::http`]: crate::ServeConfig::http
#[derive(Clone)]
pub struct Readiness(Arc<Shared>);

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("mode", &self.0.mode)
            .field("serving", &self.0.serving.get().is_some())
            .finish()
    }
}

impl Readiness {
    /// From now on `/readyz` follows `serving.health` and `/metrics` answers.
    pub(crate) fn serving(&self, serving: Serving) {
        let _ = self.0.serving.set(serving);
    }
}

/// The running HTTP listener.
#[derive(Debug)]
pub struct HttpServer {
    readiness: Readiness,
    local_addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` (`host:port`) and serves the probes and metrics (`/readyz` answers `503
    /// starting` until [`crate::serve`] marks the daemon ready).
    ///
    /// # Errors
    /// [`ServeError::UnsafeBind`] for `local` mode on a non-loopback address (nothing is bound),
    /// [`ServeError::AddrInUse`], [`ServeError::InvalidAddress`] or [`ServeError::Bind`].
    pub async fn start(addr: &str, mode: AuthMode) -> Result<Self, ServeError> {
        let listener = crate::serve::bind_tcp(addr).await?;
        let local_addr = listener.local_addr().map_err(|error| ServeError::Bind {
            addr: addr.to_owned(),
            error,
        })?;
        crate::auth::resolve_mode(Some(mode), false, local_addr)?;
        Ok(Self::spawn(listener, local_addr, mode))
    }

    fn spawn(listener: TcpListener, local_addr: SocketAddr, mode: AuthMode) -> Self {
        let shared = Arc::new(Shared {
            mode,
            serving: OnceLock::new(),
            console: crate::console::Sessions::default(),
            login_throttle: phrony_auth::LoginThrottle::default(),
        });
        let app = axum::Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(&shared))
            .merge(crate::console::router(Arc::clone(&shared)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // The peer address is the console's sign-in throttle's client key.
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "the HTTP listener failed");
            }
        });
        tracing::info!(
            address = %local_addr,
            "HTTP probes, metrics and the approvals console on http://{local_addr}/console/"
        );
        Self {
            readiness: Readiness(shared),
            local_addr,
            stop,
            task,
        }
    }

    /// The address actually bound.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The handle to give [`crate::serve`] (in [`crate::ServeConfig::http`]).
    #[must_use]
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Stops accepting, lets open requests finish for up to `grace`, then ends.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn healthz() -> Response {
    text(StatusCode::OK, "ok\n".to_owned())
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    match shared.serving.get() {
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting (waiting for the database or recovering sessions)\n".to_owned(),
        ),
        Some(serving) => match serving.health.not_serving_reason() {
            None => text(StatusCode::OK, "ready\n".to_owned()),
            Some(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            ),
        },
    }
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(serving) = shared.serving.get() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting\n".to_owned(),
        );
    };
    if shared.mode == AuthMode::Required
        && let Err(refusal) = authorize(serving.authenticator.as_ref(), &headers).await
    {
        return refusal;
    }
    let counts = match serving.ledger.metric_counts().await {
        Ok(counts) => Some(counts),
        Err(error) => {
            tracing::debug!(%error, "metrics: cannot read the ledger's counts");
            None
        }
    };
    let scrape = Scrape::new(counts, &serving.router);
    match scrape.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
            )],
            body,
        )
            .into_response(),
        Err(std::fmt::Error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n".to_owned(),
        ),
    }
}

/// Authenticates the request's bearer as the gRPC edge does and requires `read`. The refusal
/// names the problem (never the presented credential).
async fn authorize(authenticator: &dyn Authenticator, headers: &HeaderMap) -> Result<(), Response> {
    let unauthorized = |message: String| {
        let mut response = text(
            StatusCode::UNAUTHORIZED,
            format!("unauthenticated: {message}\n"),
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"phrony-runtime\""),
        );
        response
    };
    let bearer = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => match bearer_of(value) {
            Some(token) => Some(token),
            None => {
                return Err(unauthorized(
                    "malformed credential: send `authorization: Bearer <token>`".to_owned(),
                ));
            }
        },
    };
    let credentials = Credentials {
        bearer,
        peer_subject: None,
    };
    match authenticator.authenticate(credentials).await {
        Ok(principal) if principal.permits(Permission::Read) => Ok(()),
        Ok(_) => Err(text(
            StatusCode::FORBIDDEN,
            "permission denied: reading metrics needs the read permission\n".to_owned(),
        )),
        Err(error @ AuthError::Unavailable { .. }) => {
            Err(text(StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")))
        }
        Err(error) => Err(unauthorized(error.to_string())),
    }
}

/// The token of an `authorization: Bearer <token>` value; `None` when it is not that.
fn bearer_of(value: &HeaderValue) -> Option<&str> {
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// One scrape's values: the recorded catalog and the gauges read now.
#[derive(Debug)]
struct Scrape {
    catalog: Vec<phrony_metrics::Metric>,
    counts: Option<MetricCounts>,
    queue_depth: u64,
    /// Connected workers per advertised `tool@version`.
    workers: std::collections::BTreeMap<String, u64>,
}

impl Scrape {
    fn new(counts: Option<MetricCounts>, router: &Router) -> Self {
        let snapshot = router.snapshot();
        let mut workers = std::collections::BTreeMap::<String, u64>::new();
        for worker in &snapshot.workers {
            let mut keys: Vec<String> = worker
                .handlers
                .iter()
                .map(|h| format!("{}@{}", h.tool, h.version))
                .collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                *workers.entry(key).or_default() += 1;
            }
        }
        let queue_depth = snapshot
            .queues
            .iter()
            .map(|q| u64::try_from(q.depth).unwrap_or(u64::MAX))
            .sum();
        Self {
            catalog: phrony_metrics::catalog(),
            counts,
            queue_depth,
            workers,
        }
    }

    fn encode(self) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, &registry)?;
        Ok(body)
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for metric in &self.catalog {
            encode_recorded(&mut encoder, metric)?;
        }
        if let Some(counts) = &self.counts {
            let mut gauge = encoder.encode_descriptor(
                "phrony_sessions",
                "Sessions by status (read from the ledger at scrape time).",
                None,
                MetricType::Gauge,
            )?;
            for status in SessionStatus::ALL {
                let n = counts
                    .sessions_by_status
                    .iter()
                    .find(|(s, _)| s == status)
                    .map_or(0, |(_, n)| *n);
                let labels = [("status", status.as_str())];
                gauge.encode_family(&labels)?.encode_gauge(&n)?;
            }
            encoder
                .encode_descriptor(
                    "phrony_approvals_pending",
                    "Approvals waiting for a decision (read from the ledger at scrape time).",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&counts.approvals_pending)?;
            encoder
                .encode_descriptor(
                    "phrony_webhook_deliveries_pending",
                    "Webhook deliveries waiting for an attempt (read from the ledger at scrape \
                     time; 0 when webhooks are off).",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&counts.webhook_deliveries_pending)?;
        }
        encoder
            .encode_descriptor(
                "phrony_dispatch_queue_depth",
                "Tool calls waiting for a free worker slot, over every tool.",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&self.queue_depth)?;
        let mut workers = encoder.encode_descriptor(
            "phrony_workers_connected",
            "Connected workers per advertised tool@version.",
            None,
            MetricType::Gauge,
        )?;
        for (tool, n) in &self.workers {
            let labels = [("tool", tool.as_str())];
            workers.encode_family(&labels)?.encode_gauge(n)?;
        }
        Ok(())
    }
}

/// One metric of the recorded catalog.
fn encode_recorded(
    encoder: &mut DescriptorEncoder,
    metric: &phrony_metrics::Metric,
) -> Result<(), std::fmt::Error> {
    use phrony_metrics::Value;
    let kind = match metric.value {
        Value::Counter(_) | Value::Counters { .. } => MetricType::Counter,
        Value::Histogram(_) => MetricType::Histogram,
    };
    let mut out = encoder.encode_descriptor(metric.name, metric.help, None, kind)?;
    match &metric.value {
        Value::Counter(n) => out.encode_counter::<NoLabelSet, _, u64>(n, None),
        Value::Counters { label, values } => {
            for (value, n) in values {
                let labels = [(*label, *value)];
                out.encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
            Ok(())
        }
        Value::Histogram(h) => {
            let mut buckets = h.buckets.clone();
            // The encoder accumulates the buckets and prints `f64::MAX` as `+Inf`.
            buckets.push((f64::MAX, h.overflow));
            out.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &buckets, None)
        }
    }
}

/// Checks that `body` is a well-formed exposition: every line is a `#` comment or
/// `name{labels} value`, with a `phrony_` name, a numeric value and `key="value"` labels, and
/// the last line is `# EOF`. Returns the samples as (name with labels, value).
///
/// # Errors
/// The first line that does not parse, with its number.
pub fn parse_exposition(body: &str) -> Result<Vec<(String, f64)>, String> {
    let mut samples = Vec::new();
    let mut last = "";
    for (i, line) in body.lines().enumerate() {
        last = line;
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| bad("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad("value is not a number"))?,
        };
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        if !name.starts_with("phrony_")
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(bad("bad metric name"));
        }
        if name_end < series.len() {
            let labels = series[name_end..]
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .ok_or_else(|| bad("unclosed labels"))?;
            for pair in labels.split(',') {
                let (key, quoted) = pair.split_once('=').ok_or_else(|| bad("label without ="))?;
                let ok_key =
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let ok_value = quoted.len() >= 2
                    && quoted.starts_with('"')
                    && quoted.ends_with('"')
                    && !quoted[1..quoted.len() - 1].contains('"');
                if !ok_key || !ok_value {
                    return Err(bad("bad label"));
                }
            }
        }
        samples.push((series.to_owned(), value));
    }
    if last != "# EOF" {
        return Err(format!(
            "the exposition does not end with `# EOF` (last line {last:?})"
        ));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[tokio::test]
    async fn the_exposition_parses_and_carries_every_metric_of_the_catalog() {
        phrony_metrics::TOOL_CALLS.inc(phrony_metrics::Decision::Allow);
        phrony_metrics::POLICY_EVALUATION.observe(Duration::from_micros(40));
        phrony_metrics::POLICY_EVALUATION.observe(Duration::from_secs(20));
        let router = Router::builder(phrony_dispatch::RouterConfig::default())
            .build()
            .unwrap();
        let counts = MetricCounts {
            sessions_by_status: vec![(SessionStatus::Completed, 3)],
            approvals_pending: 2,
            webhook_deliveries_pending: 4,
        };
        let body = Scrape::new(Some(counts), &router).encode().unwrap();
        let samples = parse_exposition(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
        let value = |series: &str| {
            samples
                .iter()
                .find(|(s, _)| s == series)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("no {series} in\n{body}"))
        };
        assert!(value("phrony_tool_calls_total{decision=\"allow\"}") >= 1.0);
        assert!(value("phrony_policy_evaluation_seconds_bucket{le=\"+Inf\"}") >= 2.0);
        assert_eq!(
            value("phrony_policy_evaluation_seconds_bucket{le=\"+Inf\"}"),
            value("phrony_policy_evaluation_seconds_count")
        );
        assert!(value("phrony_policy_evaluation_seconds_sum") >= 20.0);
        assert_eq!(value("phrony_sessions{status=\"completed\"}"), 3.0);
        assert_eq!(value("phrony_sessions{status=\"running\"}"), 0.0);
        assert_eq!(value("phrony_approvals_pending"), 2.0);
        assert_eq!(value("phrony_webhook_deliveries_pending"), 4.0);
        assert_eq!(value("phrony_dispatch_queue_depth"), 0.0);
        for metric in phrony_metrics::catalog() {
            assert!(
                samples.iter().any(|(s, _)| s.starts_with(metric.name)),
                "{} missing from\n{body}",
                metric.name
            );
        }
    }

    #[test]
    fn the_parser_refuses_what_is_not_an_exposition() {
        assert!(parse_exposition("phrony_x 1\n# EOF\n").is_ok());
        assert!(parse_exposition("phrony_x 1\n").is_err(), "no EOF");
        assert!(parse_exposition("phrony_x one\n# EOF\n").is_err());
        assert!(parse_exposition("other_x 1\n# EOF\n").is_err());
        assert!(parse_exposition("phrony_x{a=b} 1\n# EOF\n").is_err());
        assert!(parse_exposition("phrony_x{a=\"b\"\n# EOF\n").is_err());
    }

    #[test]
    fn only_a_bearer_value_is_a_token() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer_of(&v("Bearer phr_abc")), Some("phr_abc"));
        assert_eq!(bearer_of(&v("bearer  phr_abc ")), Some("phr_abc"));
        assert_eq!(bearer_of(&v("Basic dXNlcjpwdw==")), None);
        assert_eq!(bearer_of(&v("Bearer ")), None);
        assert_eq!(bearer_of(&v("Bearer")), None);
    }

    #[tokio::test]
    async fn local_mode_refuses_a_non_loopback_http_address() {
        let err = HttpServer::start("0.0.0.0:0", AuthMode::Local)
            .await
            .unwrap_err();
        assert!(matches!(err, ServeError::UnsafeBind(_)), "{err}");
        let ok = HttpServer::start("127.0.0.1:0", AuthMode::Local)
            .await
            .unwrap();
        assert!(ok.local_addr().ip().is_loopback());
        ok.stop(Duration::from_secs(1)).await;
    }
}
